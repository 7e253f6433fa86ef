"""Phase 00 · Lab 01 (the decode loop): the mistakes its tests must catch, and its steps."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

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

MUTANTS = [
    Mutant(
        name="a prompt of exactly the limit refused",
        mistake="Refuses a prompt that fills every position, as if the sampled token needed "
        "one; vLLM (and the engine of Phase 03) serve it and give it one token.",
        module=LOOP,
        old="if prompt_len > limit:",
        new="if prompt_len >= limit:",
    ),
    Mutant(
        name="a prompt one token too long accepted",
        mistake="Accepts a prompt longer than the limit; its positions run past the cache.",
        module=LOOP,
        old="if prompt_len > limit:",
        new="if prompt_len > limit + 1:",
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
]
