"""Phase 01 · Lab 01 (the layers of a Llama): the mistakes its tests must catch, and its steps."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

NORM = "mini_vllm.layers.layernorm"
ROPE = "mini_vllm.layers.rotary_embedding"
ATTENTION = "mini_vllm.attention.contiguous"
ACTIVATION = "mini_vllm.layers.activation"

STEPS = {
    1: [f"{NORM}:rms_norm_native", f"{NORM}:RMSNorm.forward_native"],
    2: [f"{ROPE}:rope_inverse_frequencies"],
    3: [f"{ROPE}:RotaryEmbedding.forward_native", f"{ROPE}:RotaryEmbedding._rotate"],
    4: [f"{ATTENTION}:ContiguousAttentionBackend.forward"],
    5: [f"{ACTIVATION}:silu_and_mul_native"],
}

# The reference's layers are CustomOps: each class body names its op for the kernel table
# (`name`), and some alias `forward_cpu = forward_cuda`; the lab's layers are plain
# nn.Modules with one `forward`, so they have neither.
_CUSTOM_OP_FIELDS = "the reference's class names its op for the kernel table (CustomOp)"
STARTER_DIFFERS = {
    "RMSNorm (fields)": _CUSTOM_OP_FIELDS,
    "RotaryEmbedding (fields)": _CUSTOM_OP_FIELDS,
    "SiluAndMul (fields)": _CUSTOM_OP_FIELDS,
}

MUTANTS = [
    Mutant(
        name="RMSNorm statistics in the input dtype",
        mistake="Computes the mean of squares in the activation dtype instead of float32, "
        "so float16 activations of a few hundred overflow and the norm returns zeros.",
        module=NORM,
        old="    xf = x.float()\n",
        new="    xf = x\n",
    ),
    Mutant(
        name="RMSNorm without eps",
        mistake="Leaves eps out of the square root (or passes the default instead of the "
        "layer's own eps).",
        module=NORM,
        old="torch.rsqrt(variance + eps)",
        new="torch.rsqrt(variance)",
    ),
    Mutant(
        name="RMSNorm without its weight",
        mistake="Normalises but forgets to multiply by the learned weight.",
        module=NORM,
        old="(xf * torch.rsqrt(variance + eps)).to(x.dtype) * weight",
        new="(xf * torch.rsqrt(variance + eps)).to(x.dtype)",
    ),
    Mutant(
        name="residual added after the norm",
        mistake="Normalises x alone and adds the residual only to the returned stream, "
        "instead of normalising the sum.",
        module=NORM,
        old="""        x = x + residual
        return rms_norm_native(x, self.weight, self.eps), x""",
        new="""        return rms_norm_native(x, self.weight, self.eps), x + residual""",
    ),
    Mutant(
        name="RoPE exponent -i/D instead of -2i/D",
        mistake="Counts the channel pairs 0, 1, 2, ... in the exponent instead of the "
        "channel indices 0, 2, 4, ..., so the frequencies fall off half as fast.",
        module=ROPE,
        old="torch.arange(0, rotary_dim, 2, dtype=torch.int64)",
        new="torch.arange(0, rotary_dim // 2, dtype=torch.int64)",
    ),
    Mutant(
        name="RoPE rotates the wrong way",
        mistake="Swaps the sign of the sine in rotate-half RoPE, turning every pair by "
        "-theta (relative positions still work, but not the model's weights).",
        module=ROPE,
        old="return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin)",
        new="return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), -sin)",
    ),
    Mutant(
        name="interleaved pairs put back as halves",
        mistake="In the interleaved layout, writes the rotated pairs back as two halves "
        "(cat) instead of side by side (stack and flatten).",
        module=ROPE,
        old="torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)",
        new="torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)",
    ),
    Mutant(
        name="RoPE by token index, not position",
        mistake="Rotates token t by the angle of position t, as if every batch were one "
        "sequence starting at 0, instead of looking up each token's own position.",
        module=ROPE,
        old="self.cos_sin_cache.index_select(0, positions)",
        new="self.cos_sin_cache[: positions.shape[0]]",
    ),
    Mutant(
        name="new keys written at position 0",
        mistake="Writes the step's keys and values at the start of the cache instead of "
        "at start_pos, overwriting the prompt at every decode step.",
        module=ATTENTION,
        old="kv_cache.narrow(2, start, new).copy_(new_kv)",
        new="kv_cache.narrow(2, 0, new).copy_(new_kv)",
    ),
    Mutant(
        name="query head h reads KV head h % Hkv",
        mistake="Groups the query heads round-robin (head h reads KV head h % Hkv) "
        "instead of in blocks (h // group), the order the weights were trained with.",
        module=ATTENTION,
        old="queries = q.view(batch, num_kv_heads, group, head_dim)",
        new="queries = q.view(batch, group, num_kv_heads, head_dim).transpose(1, 2)",
    ),
    Mutant(
        name="causal mask ignores start_pos",
        mistake="Builds the causal mask as if the new tokens sat at positions 0..n-1, "
        "which is right for a first prefill and wrong for a chunk on top of a cache.",
        module=ATTENTION,
        old="q_pos = torch.arange(start, end, device=q.device).unsqueeze(1)",
        new="q_pos = torch.arange(0, new, device=q.device).unsqueeze(1)",
    ),
    Mutant(
        name="SiLU on the up half",
        mistake="Applies SiLU to the second half (up) instead of the first (gate).",
        module=ACTIVATION,
        old="return F.silu(gate) * up",
        new="return gate * F.silu(up)",
    ),
]
