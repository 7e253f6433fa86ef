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

# Dtypes, and the caller's tensors: every test above ran in float32 and never looked at
# the tensors it passed in.
MUTANTS += [
    Mutant(
        name="RMSNorm returns float32",
        mistake="Normalises in float32 and multiplies by the weight without casting back, so "
        "a bfloat16 model's activations come back in float32.",
        module=NORM,
        old="(xf * torch.rsqrt(variance + eps)).to(x.dtype) * weight",
        new="(xf * torch.rsqrt(variance + eps)) * weight",
    ),
    Mutant(
        name="RMSNorm normalises its input in place",
        mistake="Scales the float32 copy in place (xf.mul_), but x.float() of a float32 "
        "tensor is that tensor: the caller's activations, which the decoder layer keeps as "
        "its residual stream, are overwritten.",
        module=NORM,
        old="return (xf * torch.rsqrt(variance + eps)).to(x.dtype) * weight",
        new="return xf.mul_(torch.rsqrt(variance + eps)).to(x.dtype) * weight",
    ),
    Mutant(
        name="residual added in place",
        mistake="Adds the residual with x += residual, writing the sum into the tensor the "
        "caller passed as x.",
        module=NORM,
        old="x = x + residual",
        new="x += residual",
    ),
    Mutant(
        name="residual stream in float32",
        mistake="Adds x and the residual in float32 for accuracy and returns that sum as the "
        "new residual (and a float32 output), so float32 leaks into a bfloat16 model.",
        module=NORM,
        old="x = x + residual",
        new="x = x.float() + residual.float()",
    ),
    Mutant(
        name="RoPE frequencies in float64",
        mistake="Computes the inverse frequencies in float64 (Python floats or .double()), "
        "so the angles are not the float32 ones the model was trained with.",
        module=ROPE,
        old="inv_freq = 1.0 / (base**exponents)",
        new="inv_freq = 1.0 / (base**exponents.double())",
    ),
    Mutant(
        name="RoPE table rows not cast to the heads' dtype",
        mistake="Multiplies bfloat16 heads by the float32 cos/sin rows, so the rotated q and "
        "k come back in float32 beside a bfloat16 v.",
        module=ROPE,
        old=".to(query.dtype).unbind(1)",
        new=".unbind(1)",
    ),
    Mutant(
        name="RoPE positions rounded to the activations' dtype",
        mistake="Turns the positions into the activations' dtype before using them (as in "
        "positions.to(q.dtype) * inv_freq), so a bfloat16 model rotates position 1001 as "
        "position 1000.",
        module=ROPE,
        old="self.cos_sin_cache.index_select(0, positions)",
        new="self.cos_sin_cache.index_select(0, positions.to(query.dtype).long())",
    ),
    Mutant(
        name="RoPE rotates in place",
        mistake="Writes the rotated heads back into the query and key it was given, as "
        "vLLM's CUDA kernel does, although the layer promises new tensors.",
        module=ROPE,
        old="return rotated.view(num_tokens, -1).split([query.shape[-1], key.shape[-1]], dim=1)",
        new="q_out, k_out = rotated.view(num_tokens, -1).split("
        "[query.shape[-1], key.shape[-1]], dim=1)\n"
        "        return query.copy_(q_out), key.copy_(k_out)",
    ),
    Mutant(
        name="a step that fills the cache exactly is refused",
        mistake="Checks the cache's length with >=, so a step ending exactly at the last "
        "position (a prompt as long as the cache, or its last decode) is refused.",
        module=ATTENTION,
        old="if end > kv_cache.shape[2]:",
        new="if end >= kv_cache.shape[2]:",
    ),
    Mutant(
        name="decode ignores the given scale",
        mistake="Lets the attention call use its default 1/sqrt(D) in decode instead of the "
        "scale the backend was built with.",
        module=ATTENTION,
        old="out = F.scaled_dot_product_attention(queries, keys, values, scale=self.scale)",
        new="out = F.scaled_dot_product_attention(queries, keys, values)",
    ),
    Mutant(
        name="prefill ignores the given scale",
        mistake="Lets the attention call use its default 1/sqrt(D) in prefill instead of the "
        "scale the backend was built with.",
        module=ATTENTION,
        old="queries, keys, values, attn_mask=mask, scale=self.scale",
        new="queries, keys, values, attn_mask=mask",
    ),
    Mutant(
        name="queries scaled in place",
        mistake="Scales the queries in place (q *= scale) before an unscaled attention, "
        "writing into the q the caller passed.",
        module=ATTENTION,
        old="queries = q.view(batch, num_kv_heads, group, head_dim)\n"
        "            out = F.scaled_dot_product_attention(queries, keys, values, scale=self.scale)",
        new="queries = q.mul_(self.scale or head_dim**-0.5)"
        ".view(batch, num_kv_heads, group, head_dim)\n"
        "            out = F.scaled_dot_product_attention(queries, keys, values, scale=1.0)",
    ),
    Mutant(
        name="decode attention in float32",
        mistake="Runs the attention in float32 for accuracy and forgets to cast the result "
        "back, so a bfloat16 decode step returns float32.",
        module=ATTENTION,
        old="out = F.scaled_dot_product_attention(queries, keys, values, scale=self.scale)",
        new="out = F.scaled_dot_product_attention("
        "queries.float(), keys.float(), values.float(), scale=self.scale)",
    ),
    Mutant(
        name="SiLU in place",
        mistake="Uses F.silu(gate, inplace=True) to save memory: gate is a view of the "
        "caller's gate_up, which is overwritten.",
        module=ACTIVATION,
        old="return F.silu(gate) * up",
        new="return F.silu(gate, inplace=True) * up",
    ),
    Mutant(
        name="SiLU in float32",
        mistake="Takes the SiLU in float32 for accuracy and never casts back, so a bfloat16 "
        "MLP hands float32 to down_proj.",
        module=ACTIVATION,
        old="return F.silu(gate) * up",
        new="return F.silu(gate.float()) * up",
    ),
]
