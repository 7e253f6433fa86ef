"""Phase 00 · Lab 01 (the decode loop): the mistakes its tests must catch, and its steps.

Some mistakes are made in two places of a module at once (a loop that keeps the sequence
in the caller's prompt list takes the list without copying it and appends to it);
`_in_two_places` turns such a pair of changes into one `Mutant` over the text between them.
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

ROOT = pathlib.Path(__file__).resolve().parents[3]
SEQUENCE = "mini_vllm.engine.sequence"
SAMPLER = "mini_vllm.layers.sampler"
LOOP = "mini_vllm.teaching.decode_loop"

STEPS = {
    1: [f"{SEQUENCE}:check_stop"],
    2: [f"{SAMPLER}:apply_top_k_top_p"],
    3: [f"{LOOP}:run_model_step"],
    4: [f"{LOOP}:full_forward_logits"],
    5: [f"{LOOP}:generate", f"{LOOP}:generate_lockstep"],
}

STARTER_DIFFERS = {
    "Sampler.forward": "the starter's Sampler draws through the student's apply_top_k_top_p "
    "(so that the loop uses the filter of step 2) and leaves out the logits processors "
    "(min_p, penalties, logit_bias, min_tokens) that the lab does not use; for the same "
    "logits and generators it draws the same tokens as mini_vllm's",
}


def _in_two_places(first: tuple[str, str], second: tuple[str, str]) -> dict[str, str]:
    """old/new for one mistake made at two places of the loop's module: the source from
    the start of `first`'s old text to the end of `second`'s, with both changed."""
    source = (ROOT / "mini_vllm" / "teaching" / "decode_loop.py").read_text(encoding="utf-8")
    for old, _ in (first, second):
        if source.count(old) != 1:
            raise ValueError(f"{old!r} occurs {source.count(old)} times in {LOOP}")
    start = source.index(first[0])
    end = source.index(second[0]) + len(second[0])
    if start >= end - len(second[0]):
        raise ValueError("the first change must come before the second")
    old = source[start:end]
    new = first[1] + old[len(first[0]) : -len(second[0])] + second[1]
    return {"old": old, "new": new}


MUTANTS = [
    Mutant(
        name="a prompt that fills the context served",
        mistake="Serves a prompt of exactly max_model_len tokens (its one token needs no "
        "cache slot), so prompt + output pass the context limit; vLLM refuses it, as the "
        "engine of Phase 03 does.",
        module=LOOP,
        old="if prompt_len >= limit:",
        new="if prompt_len > limit:",
    ),
    Mutant(
        name="a prompt one token too long accepted",
        mistake="Accepts a prompt longer than the limit; its positions run past the cache.",
        module=LOOP,
        old="if prompt_len >= limit:",
        new="if prompt_len > limit + 1:",
    ),
    Mutant(
        name="a prompt one short of the context refused",
        mistake="Refuses a prompt of max_model_len - 1 tokens, as if every new token needed "
        "a cache slot; it fits and gets exactly one token.",
        module=LOOP,
        old="if prompt_len >= limit:",
        new="if prompt_len >= limit - 1:",
    ),
    Mutant(
        name="max_tokens checked before EOS",
        mistake="Checks max_tokens before the EOS, so an EOS on the last allowed token "
        "finishes as 'length' instead of 'stop'.",
        module=SEQUENCE,
        old="""    if not params.ignore_eos and token_id in eos_token_ids:
        return FinishReason.STOP
    if num_generated >= params.max_tokens:
        return FinishReason.LENGTH""",
        new="""    if num_generated >= params.max_tokens:
        return FinishReason.LENGTH
    if not params.ignore_eos and token_id in eos_token_ids:
        return FinishReason.STOP""",
    ),
    Mutant(
        name="ignore_eos ignored",
        mistake="Stops on an EOS even when the request asked to ignore it.",
        module=SEQUENCE,
        old="if not params.ignore_eos and token_id in eos_token_ids:",
        new="if token_id in eos_token_ids:",
    ),
    Mutant(
        name="one token past max_tokens",
        mistake="Stops only once more than max_tokens tokens exist (> instead of >=).",
        module=SEQUENCE,
        old="if num_generated >= params.max_tokens:",
        new="if num_generated > params.max_tokens:",
    ),
    Mutant(
        name="top-k keeps k + 1",
        mistake="Keeps the tokens of rank 0..k instead of 0..k-1 in the top-k cut.",
        module=SAMPLER,
        old="drop = rank.unsqueeze(0) >= k.unsqueeze(1)",
        new="drop = rank.unsqueeze(0) > k.unsqueeze(1)",
    ),
    Mutant(
        name="top-p on the uncut distribution",
        mistake="Computes the top-p probabilities before the top-k cut instead of on the "
        "renormalised survivors.",
        module=SAMPLER,
        old="""    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)""",
        new="""    probs = sorted_logits.softmax(dim=-1)
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))""",
    ),
    Mutant(
        name="top-p mass includes the token itself",
        mistake="Drops a token once the running sum including it reaches p, which can "
        "drop the most likely token itself.",
        module=SAMPLER,
        old="mass_before = probs.cumsum(dim=-1) - probs",
        new="mass_before = probs.cumsum(dim=-1)",
    ),
    Mutant(
        name="LM head over every row",
        mistake="Runs the LM head over every row and picks the sampled rows afterwards "
        "(a vocab-sized product per prompt token at prefill).",
        module=LOOP,
        old="""        hidden_states = hidden_states.index_select(0, sample_rows)
    return model.compute_logits(hidden_states)""",
        new="""        return model.compute_logits(hidden_states).index_select(0, sample_rows)
    return model.compute_logits(hidden_states)""",
    ),
    Mutant(
        name="cache left bound after an error",
        mistake="Unbinds the cache after a successful run only, so a failing forward "
        "leaves the cache bound to the model.",
        module=LOOP,
        old="""    finally:
        bind_kv_caches(model, None, None)  # let the cache be freed with this call""",
        new="""    except Exception:
        raise
    bind_kv_caches(model, None, None)  # let the cache be freed with this call""",
    ),
    Mutant(
        name="decode starts one position late",
        mistake="Writes the first decoded token at position P + 1 instead of P, leaving a "
        "hole in the cache.",
        module=LOOP,
        old="position = prompt_len  # where the token just sampled will be written",
        new="position = prompt_len + 1  # where the token just sampled will be written",
    ),
    Mutant(
        name="decoding goes on after the stop",
        mistake="Loops until the cache is full instead of stopping when the request "
        "finished, so tokens after an EOS are still computed.",
        module=LOOP,
        old="while not all(finished) and position < max_len:",
        new="while position < max_len:",
    ),
    Mutant(
        name="generator made again every step",
        mistake="Makes the seeded generator anew at every decode step, so a seeded "
        "request repeats its first random draw instead of drawing fresh numbers.",
        module=LOOP,
        old="""                next_ids = sampler(logits, params_list, generators)
                token_list = next_ids.tolist()
                # ANCHOR_END: decode_step""",
        new="""                next_ids = sampler(
                    logits, params_list, [make_generator(p, device) for p in params_list]
                )
                token_list = next_ids.tolist()
                # ANCHOR_END: decode_step""",
    ),
    Mutant(
        name="ITL measured from the request start",
        mistake="Records each inter-token latency as the time since the request arrived "
        "instead of the gap since the previous token.",
        module=LOOP,
        old="result.itl_s.append(now - previous)",
        new="result.itl_s.append(now - start)",
    ),
    Mutant(
        name="first gap counts the prefill",
        mistake="Starts the first inter-token gap at the request's arrival instead of at "
        "the first token, so the prefill is counted twice (in TTFT and in the first ITL).",
        module=LOOP,
        old="""            accept(token_list)
            previous = now
""",
        new="""            accept(token_list)
            previous = start
""",
    ),
    Mutant(
        name="TTFT clock started after the prefill",
        mistake="Starts the request's clock after the prefill has been sent, so the TTFT "
        "leaves out the prefill forward.",
        module=LOOP,
        old="""            logits = run_model_step(
                model,
                input_ids,
                positions,
                ContiguousAttentionMetadata.prefill(batch, prompt_len),
                last_rows,
            )
""",
        new="""            logits = run_model_step(
                model,
                input_ids,
                positions,
                ContiguousAttentionMetadata.prefill(batch, prompt_len),
                last_rows,
            )
            start = time.perf_counter()
""",
    ),
    Mutant(
        name="the filter changes the caller's logits",
        mistake="Masks the caller's logits in place (and returns them), so whoever reads "
        "them after the filter sees the cut ones.",
        module=SAMPLER,
        old="    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)",
        new="    return logits.scatter_(-1, order, sorted_logits)",
    ),
    Mutant(
        name="the filter returns float32",
        mistake="Works in float32 and returns float32 logits for bfloat16 or float16 input.",
        module=SAMPLER,
        old="    vocab = logits.shape[-1]\n    sorted_logits, order = logits.sort(",
        new="    logits = logits.float()\n    vocab = logits.shape[-1]\n"
        "    sorted_logits, order = logits.sort(",
    ),
    Mutant(
        name="top-k of the whole vocabulary cuts one",
        mistake="Clamps k to vocab - 1, so a top-k of the vocabulary size or more drops the "
        "least likely token instead of cutting nothing.",
        module=SAMPLER,
        old="top_k.clamp(max=vocab)",
        new="top_k.clamp(max=vocab - 1)",
    ),
    Mutant(
        name="top-p not reached at equality",
        mistake="Keeps a token while the mass before it is at most p (> instead of >=), so a "
        "set whose probability equals p exactly takes one token more.",
        module=SAMPLER,
        old="drop = mass_before >= top_p.unsqueeze(1)",
        new="drop = mass_before > top_p.unsqueeze(1)",
    ),
    Mutant(
        name="the sampler skips the filter",
        mistake="Draws from the temperature-scaled distribution without the top-k / top-p "
        "filter, so the loop never uses it.",
        module=SAMPLER,
        old="        if any(p.top_k > 0 or p.top_p < 1.0 for p in params):",
        new="        if False:",
    ),
    Mutant(
        name="sample rows in sorted order",
        mistake="Picks the sample rows with a mask or a sorted index, so their logits come "
        "back in row order, not in the order asked for.",
        module=LOOP,
        old="hidden_states = hidden_states.index_select(0, sample_rows)",
        new="hidden_states = hidden_states.index_select(0, sample_rows.sort().values)",
    ),
    Mutant(
        name="no-cache reference in float32",
        mistake="Allocates the no-cache reference's KV cache with the default dtype "
        "(float32) instead of the model's: a bfloat16 model's attention fails.",
        module=LOOP,
        old="        weight.dtype,\n        weight.device,",
        new="        torch.float32,\n        weight.device,",
    ),
    Mutant(
        name="decode cache in float32",
        mistake="Allocates the loop's KV cache with the default dtype (float32) instead of "
        "the model's: a bfloat16 model's attention fails.",
        module=LOOP,
        old="        config.head_dim,\n        dtype,\n        device,\n    )",
        new="        config.head_dim,\n        torch.float32,\n        device,\n    )",
    ),
    Mutant(
        name="the prompt list of the caller grows",
        mistake="Keeps the sequence in the caller's prompt list, appending each new token "
        "to it, so the caller's prompt is changed by the call.",
        module=LOOP,
        **_in_two_places(
            (
                "            result.token_ids.append(token_id)\n",
                "            result.token_ids.append(token_id)\n"
                "            prompts[i].append(token_id)\n",
            ),
            ("        [list(prompt_token_ids)],", "        [prompt_token_ids],"),
        ),
    ),
    Mutant(
        name="TTFT clock started after the cache is set up",
        mistake="Reads the request's arrival after allocating its KV cache, so the TTFT "
        "leaves out the set-up the user waited for.",
        module=LOOP,
        old="""    start = time.perf_counter()  # the request's clock includes allocating its cache
    kv_caches = allocate_contiguous_kv_caches(
        config.num_hidden_layers,
        batch,
        max_len,
        config.num_key_value_heads,
        config.head_dim,
        dtype,
        device,
    )
""",
        new="""    kv_caches = allocate_contiguous_kv_caches(
        config.num_hidden_layers,
        batch,
        max_len,
        config.num_key_value_heads,
        config.head_dim,
        dtype,
        device,
    )
    start = time.perf_counter()
""",
    ),
    Mutant(
        name="token time read before the draw",
        mistake="Reads the clock when the logits are ready, before the token is drawn and "
        "copied to the host, so the draw is left out of the TTFT and of every gap.",
        module=LOOP,
        old="""                next_ids = sampler(logits, params_list, generators)
                token_list = next_ids.tolist()
                # ANCHOR_END: decode_step
                synchronize(device)
                now = time.perf_counter()""",
        new="""                now = time.perf_counter()
                next_ids = sampler(logits, params_list, generators)
                token_list = next_ids.tolist()
                # ANCHOR_END: decode_step""",
    ),
]
