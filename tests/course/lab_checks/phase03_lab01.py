"""Phase 03, lab 01 (the scheduler): the steps, and the mistakes the lab's tests must catch."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "labs"))
from mutation import Mutant

SCHED = "mini_vllm.engine.scheduler"
S = f"{SCHED}:Scheduler"

STEPS = {
    1: [f"{S}._why_never_runs"],
    2: [f"{S}.schedule"],
    3: [
        f"{S}.update_from_output",
        f"{S}._apply_output",
        f"{S}._finish_if_stopped",
        f"{S}._stop_reason",
    ],
    4: [f"{S}._make_room"],
    5: [f"{S}._preempt"],
}

MUTANTS = [
    Mutant(
        name="re-admits in the step that preempted",
        mistake="Admits waiting requests even in a step that preempted, so the request just "
        "preempted can come straight back in the same step.",
        module=SCHED,
        old="            not preempted\n            and self._waiting",
        new="            self._waiting",
    ),
    Mutant(
        name="new prompt not cut to the budget",
        mistake="Admits a new prompt whole with chunked prefill on, even when it is longer "
        "than the budget left.",
        module=SCHED,
        old="num_new = budget  # chunked prefill: the rest comes in later steps",
        new="pass  # chunked prefill: the rest comes in later steps",
    ),
    Mutant(
        name="running prompt not cut to the budget",
        mistake="Gives a running request all the tokens it lacks, not the budget that is left, "
        "so the next chunk of a long prompt overflows the step.",
        module=SCHED,
        old="num_new = min(seq.num_new_tokens, budget)",
        new="num_new = seq.num_new_tokens",
    ),
    Mutant(
        name="budget off by one",
        mistake="Treats a prompt that exactly fills the remaining budget as too long "
        "(>= instead of >): without chunking it waits a step for nothing.",
        module=SCHED,
        old="            if num_new > budget:",
        new="            if num_new >= budget:",
    ),
    Mutant(
        name="max_num_seqs off by one",
        mistake="Admits while the running list is at most max_num_seqs (<= instead of <), "
        "one request too many.",
        module=SCHED,
        old="len(self._running) < self.config.max_num_seqs",
        new="len(self._running) <= self.config.max_num_seqs",
    ),
    Mutant(
        name="admits when blocks are short",
        mistake="Admits a prompt as soon as any block is free, instead of checking that all the "
        "blocks its tokens need are free.",
        module=SCHED,
        old="if not self.block_manager.can_allocate(seq, num_new, num_cached):",
        new="if self.block_manager.num_free_blocks == 0:",
    ),
    Mutant(
        name="prefix cache ignored",
        mistake="Computes every prompt from token 0, ignoring the blocks prefix caching "
        "already holds.",
        module=SCHED,
        old="num_cached = self.block_manager.num_cached_tokens(seq)",
        new="num_cached = 0",
    ),
    Mutant(
        name="new prefills before the decodes",
        mistake="Puts the rows of newly admitted requests in front of the running requests' "
        "rows (prefill first), not after them.",
        module=SCHED,
        old="self._running.append(seq)\n            rows.append(self._row(seq, num_new))",
        new="self._running.append(seq)\n            rows.insert(0, self._row(seq, num_new))",
    ),
    Mutant(
        name="preempts the oldest",
        mistake="Preempts the oldest running request instead of the most recently admitted one.",
        module=SCHED,
        old="victim = self._running.pop()",
        new="victim = self._running.pop(0)",
    ),
    Mutant(
        name="preempted request to the back",
        mistake="Puts a preempted request at the back of the waiting queue, so requests that "
        "arrived after it overtake it.",
        module=SCHED,
        old="self._waiting.appendleft(seq)",
        new="self._waiting.append(seq)",
    ),
    Mutant(
        name="self-preemption not noticed",
        mistake="Keeps scheduling a request after it had to preempt itself (the freed blocks "
        "then look like room for it).",
        module=SCHED,
        old="            if victim is seq:\n                return False\n",
        new="",
    ),
    Mutant(
        name="sampled token for a mid-prompt chunk",
        mistake="Appends whatever token the runner returns for every row, including a prefill "
        "chunk that stopped short of the prompt's end.",
        module=SCHED,
        old="tokens.append(as_token_id(token) if row.samples_token else None)",
        new="tokens.append(None if token is None else as_token_id(token))",
    ),
    Mutant(
        name="stop rule checked before appending",
        mistake="Checks max_tokens before counting the token just sampled, so every request "
        "gets one token too many.",
        module=SCHED,
        old="            seq.num_output_tokens - pending,",
        new="            seq.num_output_tokens - pending - 1,",
    ),
    Mutant(
        name="max_model_len never stops",
        mistake="Stops only on EOS and max_tokens, letting prompt + output grow past "
        "max_model_len.",
        module=SCHED,
        old="max_model_len=self.config.max_model_len,",
        new="max_model_len=None,",
    ),
    Mutant(
        name="length checked before EOS",
        mistake="Checks the length limits before EOS, so an EOS sampled as the last allowed "
        "token is reported as LENGTH instead of STOP.",
        module="mini_vllm.engine.sequence",
        old="    if not params.ignore_eos and token_id in eos_token_ids:\n"
        "        return FinishReason.STOP\n"
        "    if num_generated >= params.max_tokens:\n"
        "        return FinishReason.LENGTH\n",
        new="    if num_generated >= params.max_tokens:\n"
        "        return FinishReason.LENGTH\n"
        "    if not params.ignore_eos and token_id in eos_token_ids:\n"
        "        return FinishReason.STOP\n",
    ),
    Mutant(
        name="finished request keeps its blocks",
        mistake="Finishes a request without giving its KV blocks back.",
        module=SCHED,
        old="            self.block_manager.free(seq)\n            self._running.remove(seq)\n"
        "        self._requests.pop(seq.seq_id, None)",
        new="            self._running.remove(seq)\n        self._requests.pop(seq.seq_id, None)",
    ),
    Mutant(
        name="a prompt that fills max_model_len admitted",
        mistake="Admits a prompt of exactly max_model_len tokens (> instead of >=): it gets one "
        "token, and prompt + output pass max_model_len; vLLM refuses it on arrival.",
        module=SCHED,
        old="if seq.num_prompt_tokens >= self.config.max_model_len:",
        new="if seq.num_prompt_tokens > self.config.max_model_len:",
    ),
    Mutant(
        name="a prompt one short of max_model_len refused",
        mistake="Refuses a prompt of max_model_len - 1 tokens, which has room for exactly one "
        "output token.",
        module=SCHED,
        old="if seq.num_prompt_tokens >= self.config.max_model_len:",
        new="if seq.num_prompt_tokens >= self.config.max_model_len - 1:",
    ),
    Mutant(
        name="blocks needed rounded down",
        mistake="Counts the blocks a request needs with floor division, so a request one token "
        "too big for the cache is accepted.",
        module=SCHED,
        old="needed = self.block_manager.blocks_needed(seq.num_tokens)",
        new="needed = seq.num_tokens // self.block_manager.block_size",
    ),
    Mutant(
        name="a finished request's id stays taken",
        mistake="Finishes a request without forgetting its id, so a new request with the id of "
        "a finished one is refused as a duplicate.",
        module=SCHED,
        old="        self._requests.pop(seq.seq_id, None)\n        seq.finish(reason)\n",
        new="        seq.finish(reason)\n",
    ),
    Mutant(
        name="only one EOS id stops",
        mistake="Checks the sampled token against one end-of-sequence id, so a model with "
        "several (Llama 3 has three) runs past the others.",
        module=SCHED,
        old="            self.eos_token_ids,\n            num_tokens=seq.num_tokens - pending,",
        new="            frozenset(sorted(self.eos_token_ids)[:1]),\n"
        "            num_tokens=seq.num_tokens - pending,",
    ),
    Mutant(
        name="max_model_len stops one token late",
        mistake="Stops a request once prompt + output pass max_model_len (> instead of >=), "
        "one token past the context limit.",
        module="mini_vllm.engine.sequence",
        old="num_tokens is not None and num_tokens >= max_model_len:",
        new="num_tokens is not None and num_tokens > max_model_len:",
    ),
    Mutant(
        name="admits with no budget left",
        mistake="Keeps admitting once the token budget is spent, giving the next request a "
        "row of zero tokens.",
        module=SCHED,
        old="            and self._waiting\n            and budget > 0\n",
        new="            and self._waiting\n",
    ),
    Mutant(
        name="a preempted request keeps its computed count",
        mistake="Frees a preempted request's blocks but leaves num_computed_tokens as it was, "
        "so its next admission skips the tokens whose K/V was just thrown away.",
        module=SCHED,
        old="        self.block_manager.free(seq)\n        seq.num_computed_tokens = 0\n"
        "        seq.status = SequenceStatus.WAITING\n        why = self._why_never_runs(seq)",
        new="        self.block_manager.free(seq)\n"
        "        seq.status = SequenceStatus.WAITING\n        why = self._why_never_runs(seq)",
    ),
    Mutant(
        name="a request's preemptions counted once",
        mistake="Sets the request's preemption count to 1 instead of adding one, so a request "
        "preempted twice reports one preemption.",
        module=SCHED,
        old="        seq.num_preemptions += 1\n",
        new="        seq.num_preemptions = 1\n",
    ),
]
