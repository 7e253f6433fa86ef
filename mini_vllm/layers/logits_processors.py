"""The sampling options that reshape the logits before the draw, batched over the rows.

vLLM counterpart: vllm/v1/sample/ops/penalties.py (`apply_all_penalties`: repetition,
then frequency and presence), vllm/v1/sample/logits_processor/builtin.py
(`MinTokensLogitsProcessor`, `LogitBiasLogitsProcessor`, `MinPLogitsProcessor`) and the
order vllm/v1/sample/sampler.py applies them in: min_tokens and logit_bias first, then
the penalties, then temperature, then min_p, then top-k/top-p.

Each function takes the whole batch's logits `[B, vocab]` and per-row settings as
tensors, and changes only the rows whose setting is on; a row with every option off
comes out as it went in. `SamplingBatch.build` turns the rows' `SamplingParams` (and,
for the penalties, their tokens so far) into those tensors once a step.

The penalties need each request's token counts. Built from the token lists at every step
(`SamplingBatch.build` given histories, the readable version, and vLLM's way), that is
host work proportional to everything generated so far; the engine instead keeps each
penalised request's counts on the device (`PenaltyCounts`), builds them once from the
tokens when the request first samples, and adds each step's sampled token on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from mini_vllm.sampling_params import SamplingParams
from mini_vllm.torch_utils import async_tensor_h2d

__all__ = [
    "PenaltyCounts",
    "SamplingBatch",
    "apply_logit_bias",
    "apply_min_p",
    "apply_min_tokens",
    "apply_penalties",
]


@dataclass
class SamplingBatch:
    """What the processors need of one step's sampling rows, on the logits' device."""

    presence: torch.Tensor  # [B] float
    frequency: torch.Tensor  # [B] float
    repetition: torch.Tensor  # [B] float
    min_p: torch.Tensor  # [B] float
    # [B, vocab] counts of each token among the row's generated tokens, and whether it is
    # in the prompt: the penalties' view of the history. None when no row has a penalty.
    output_counts: torch.Tensor | None
    in_prompt: torch.Tensor | None
    # (row, token, bias) triples of logit_bias, and the (row, token) pairs min_tokens bans.
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    banned: tuple[torch.Tensor, torch.Tensor] | None

    @classmethod
    def build(
        cls,
        params: Sequence[SamplingParams],
        histories: Sequence[tuple[Sequence[int], Sequence[int]]] | None,
        eos_token_ids: Sequence[int],
        vocab_size: int,
        device: torch.device,
        counts: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> SamplingBatch:
        """`histories[i]` = (prompt ids, generated ids) of row i; needed for the penalties
        (counts) and for min_tokens (how many were generated). `counts`: the penalties'
        (output counts, in-prompt mask), `[B, vocab]` each, kept elsewhere
        (`PenaltyCounts.gather`); None: counted here from the histories."""

        def column(values) -> torch.Tensor:
            return async_tensor_h2d(values, torch.float32, device)

        def index(values) -> torch.Tensor:  # long even when empty
            return async_tensor_h2d(values, torch.long, device)

        output_counts = in_prompt = bias = banned = None
        if counts is not None:
            output_counts, in_prompt = counts
        elif histories is not None and any(p.uses_history for p in params):
            rows_out, tokens_out, rows_in, tokens_in = [], [], [], []
            for row, (prompt, generated) in enumerate(histories):
                if params[row].uses_history:
                    # Under async scheduling the last token may still be in flight (< 0).
                    known = [token for token in generated if token >= 0]
                    rows_out += [row] * len(known)
                    tokens_out += known
                    rows_in += [row] * len(prompt)
                    tokens_in += list(prompt)
            output_counts = torch.zeros(len(params), vocab_size, device=device)
            output_counts.index_put_(
                (index(rows_out), index(tokens_out)),
                torch.ones(len(rows_out), device=device),
                accumulate=True,
            )
            in_prompt = torch.zeros(len(params), vocab_size, dtype=torch.bool, device=device)
            # index_put_ with a value made on the device: `in_prompt[rows, tokens] = True`
            # would copy the Python True from the host and wait for the GPU to do it.
            in_prompt.index_put_(
                (index(rows_in), index(tokens_in)), torch.ones((), dtype=torch.bool, device=device)
            )
        triples = [
            (row, token, value)
            for row, p in enumerate(params)
            for token, value in (p.logit_bias or {}).items()
            if token < vocab_size
        ]
        if triples:
            rows, tokens, values = zip(*triples)
            bias = (index(rows), index(tokens), column(values))
        if histories is not None:
            pairs = [
                (row, token)
                for row, p in enumerate(params)
                if p.min_tokens and len(histories[row][1]) < p.min_tokens
                for token in (*eos_token_ids, *p.stop_token_ids)
                if token < vocab_size
            ]
            if pairs:
                rows, tokens = zip(*pairs)
                banned = (index(rows), index(tokens))
        return cls(
            presence=column([p.presence_penalty for p in params]),
            frequency=column([p.frequency_penalty for p in params]),
            repetition=column([p.repetition_penalty for p in params]),
            min_p=column([p.min_p for p in params]),
            output_counts=output_counts,
            in_prompt=in_prompt,
            bias=bias,
            banned=banned,
        )


# ANCHOR: penalty_counts
class PenaltyCounts:
    """The penalties' view of each penalised request, kept on the device across steps.

    A request gets a slot (a row of `output_counts` and of `in_prompt`, `[slots, vocab]`)
    the first time it samples with a penalty on; its prompt and the tokens it has so far
    are counted then, once. After each step `record` adds the tokens just sampled, on the
    device, so a step's host work no longer grows with what was generated. A request whose
    token is still in flight when its slot is made (async scheduling, after a step was
    taken back) misses that one token. `free` gives slots back; `reset` drops them all.
    """

    def __init__(self, vocab_size: int, device: torch.device) -> None:
        self.vocab_size, self.device = vocab_size, device
        self.output_counts = torch.zeros(0, vocab_size, device=device)
        self.in_prompt = torch.zeros(0, vocab_size, dtype=torch.bool, device=device)
        self.slot_of: dict[object, int] = {}
        self._free_slots: list[int] = []
        self.num_built = 0  # slots filled from a request's tokens (tests watch this)

    def gather(
        self, seqs: Sequence, rows: Sequence[int], num_rows: int
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        """The `[num_rows, vocab]` (output counts, in-prompt mask) of a step whose rows
        `rows` are the requests `seqs` (the other rows: zeros), and the slots' index."""
        slots = [self._slot(seq) for seq in seqs]
        slot_index = async_tensor_h2d(slots, torch.long, self.device)
        row_index = async_tensor_h2d(list(rows), torch.long, self.device)
        counts = torch.zeros(num_rows, self.vocab_size, device=self.device)
        in_prompt = torch.zeros(num_rows, self.vocab_size, dtype=torch.bool, device=self.device)
        counts.index_copy_(0, row_index, self.output_counts.index_select(0, slot_index))
        in_prompt.index_copy_(0, row_index, self.in_prompt.index_select(0, slot_index))
        return (counts, in_prompt), slot_index

    def record(self, slot_index: torch.Tensor, sampled: torch.Tensor) -> None:
        """Count the token each slot's request just sampled (`sampled`, on the device)."""
        ones = torch.ones(len(slot_index), device=self.device)
        self.output_counts.index_put_((slot_index, sampled), ones, accumulate=True)

    def free(self, seq_ids: Sequence) -> None:
        for seq_id in seq_ids:
            slot = self.slot_of.pop(seq_id, None)
            if slot is not None:
                self._free_slots.append(slot)

    def reset(self) -> None:
        self._free_slots += self.slot_of.values()
        self.slot_of.clear()

    def _slot(self, seq) -> int:
        slot = self.slot_of.get(seq.seq_id)
        if slot is not None:
            return slot
        if not self._free_slots:  # grow: twice the slots (at least 8), the old rows kept
            old = len(self.output_counts)
            new = max(8, 2 * old)
            self.output_counts = torch.cat(
                [self.output_counts, self.output_counts.new_zeros(new - old, self.vocab_size)]
            )
            self.in_prompt = torch.cat(
                [self.in_prompt, self.in_prompt.new_zeros(new - old, self.vocab_size)]
            )
            self._free_slots = list(range(new - 1, old - 1, -1))
        slot = self._free_slots.pop()
        self.slot_of[seq.seq_id] = slot
        self.num_built += 1
        known = [t for t in seq.output_token_ids if t >= 0]  # < 0: still in flight
        counts = torch.zeros(self.vocab_size, device=self.device)
        counts.index_put_(
            (async_tensor_h2d(known, torch.long, self.device),),
            torch.ones(len(known), device=self.device),
            accumulate=True,
        )
        prompt = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)
        prompt_ids = async_tensor_h2d(list(seq.prompt_token_ids), torch.long, self.device)
        prompt.index_fill_(0, prompt_ids, True)
        self.output_counts[slot] = counts
        self.in_prompt[slot] = prompt
        return slot


# ANCHOR_END: penalty_counts


def apply_min_tokens(logits: torch.Tensor, banned) -> torch.Tensor:
    """Before a row has its min_tokens, EOS and its stop tokens cannot be drawn."""
    if banned is not None:  # a value made on the device: no host-to-device copy and wait
        logits.index_put_(banned, torch.full((), float("-inf"), device=logits.device))
    return logits


def apply_logit_bias(logits: torch.Tensor, bias) -> torch.Tensor:
    if bias is not None:
        rows, tokens, values = bias
        logits.index_put_((rows, tokens), values, accumulate=True)
    return logits


# ANCHOR: penalties
def apply_penalties(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Repetition (every token seen, prompt or output: a positive logit divided by the
    penalty, a negative one multiplied), then frequency (minus the penalty per time the
    token was generated) and presence (minus the penalty once if it was generated)."""
    if batch.output_counts is None:
        return logits
    seen = batch.in_prompt | (batch.output_counts > 0)
    penalty = batch.repetition.unsqueeze(1)
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    logits = torch.where(seen, penalised, logits)
    logits = logits - batch.frequency.unsqueeze(1) * batch.output_counts
    return logits - batch.presence.unsqueeze(1) * (batch.output_counts > 0)


# ANCHOR_END: penalties


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Drop the tokens whose probability is below min_p times the most likely one's
    (after temperature); min_p 0 keeps every token."""
    probs = logits.softmax(dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * min_p.unsqueeze(1)
    return logits.masked_fill(probs < threshold, float("-inf"))
