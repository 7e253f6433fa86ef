"""Run the README's prediction questions on your code, beside your predictions.

Run it from this folder: `python explore.py`. It asks your `apply_top_k_top_p` the step 2
questions, plays the step 5 requests through your `generate` on mini_vllm's tiny model
(random weights, a few seconds on a CPU), and prints what your code gives next to what
you predicted in predictions.py. Where they differ, one of the two is wrong: the step's
tests say whether it is your code.
"""

from __future__ import annotations

import decode_loop as mine
import predictions
import torch
from torch import nn

from mini_vllm.models.loader import load_model
from mini_vllm.sampling_params import SamplingParams

PROMPT = [256, 72, 101, 108, 108, 111, 44, 32, 119]  # BOS + "Hello, w": the tests' prompt


class Counter(nn.Module):
    """The model, writing down the token ids and positions of every forward."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.calls = []

    def forward(self, input_ids, positions):
        self.calls.append((input_ids.tolist(), positions.tolist()))
        return self.inner(input_ids, positions)

    def compute_logits(self, hidden_states):
        return self.inner.compute_logits(hidden_states)


def attempt(what, compute):
    """`compute()`, or None after saying why it could not run."""
    try:
        return compute()
    except NotImplementedError as exc:
        print(f"  {what}: not written yet ({exc})")
    except Exception as exc:  # a bug of a step in progress: say so, go on
        print(f"  {what} raised {type(exc).__name__}: {exc}")
    return None


def kept(row: torch.Tensor) -> list[int]:
    return torch.isfinite(row).nonzero().flatten().tolist()


def step2() -> dict[str, object]:
    """Probabilities [0.3, 0.25, 0.2, 0.15, 0.1] with top_p 0.7, with and without top_k 3;
    then four equal logits with top_p 0.5."""
    row = torch.tensor([[0.3, 0.25, 0.2, 0.15, 0.1]]).log()
    found: dict[str, object] = {}
    for name, top_k in (("S2_KEPT_WITH_TOP_K", 3), ("S2_KEPT_WITHOUT_TOP_K", -1)):
        out = mine.apply_top_k_top_p(row, torch.tensor([top_k]), torch.tensor([0.7]))
        found[name] = kept(out[0])
        print(f"  top_k {top_k:2}, top_p 0.7: {out[0].tolist()}")
    out = mine.apply_top_k_top_p(torch.zeros(1, 4), torch.tensor([-1]), torch.tensor([0.5]))
    found["S2_EQUAL_LOGITS_KEPT"] = len(kept(out[0]))
    print(f"  four equal logits, top_p 0.5: {out[0].tolist()}")
    return found


def step5() -> dict[str, object]:
    """The 9-token prompt, greedy, max_tokens=7, EOS ignored; then max_tokens=50 under a
    context limit of 12."""
    model, _, _ = load_model("tiny", device="cpu", dtype=torch.float32, seed=0)
    greedy = dict(temperature=0.0, ignore_eos=True)
    counter = Counter(model)
    result = mine.generate(counter, PROMPT, SamplingParams(max_tokens=7, **greedy))
    for ids, positions in counter.calls:
        print(f"  forward: {len(ids)} token id(s) at positions {positions}")
    gaps_ms = [round(gap * 1000, 2) for gap in result.itl_s]
    print(f"  tokens {result.token_ids}, finish {result.finish_reason}, gaps (ms) {gaps_ms}")
    found: dict[str, object] = {
        "S5_FORWARDS": len(counter.calls),
        "S5_TOKEN_IDS_FED": sum(len(ids) for ids, _ in counter.calls),
        "S5_NUM_GAPS": len(result.itl_s),
    }
    recount = Counter(model)
    for k in range(result.num_generated):  # the whole sequence again for every token
        mine.full_forward_logits(recount, PROMPT + result.token_ids[:k])
    found["S5_TOKEN_IDS_WITHOUT_CACHE"] = sum(len(ids) for ids, _ in recount.calls)
    limited = Counter(model)
    capped = mine.generate(
        limited, PROMPT, SamplingParams(max_tokens=50, **greedy), max_model_len=12
    )
    print(
        f"  under max_model_len=12: tokens {capped.token_ids}, finish {capped.finish_reason}, "
        f"positions fed {[p for _, positions in limited.calls for p in positions]}"
    )
    found["S5_TOKENS_UNDER_LIMIT_12"] = capped.num_generated
    found["S5_LAST_POSITION_FED"] = max(p for _, positions in limited.calls for p in positions)
    return found


def main() -> None:
    found: dict[str, object] = {}
    for name, questions in (("step 2", step2), ("step 5", step5)):
        print(f"\n{name}:")
        found.update(attempt(name, questions) or {})
    print("\nyour predictions beside your code:")
    for answer in (
        "S2_KEPT_WITH_TOP_K",
        "S2_KEPT_WITHOUT_TOP_K",
        "S2_EQUAL_LOGITS_KEPT",
        "S5_FORWARDS",
        "S5_TOKEN_IDS_FED",
        "S5_TOKEN_IDS_WITHOUT_CACHE",
        "S5_NUM_GAPS",
        "S5_TOKENS_UNDER_LIMIT_12",
        "S5_LAST_POSITION_FED",
    ):
        yours = repr(found[answer]) if answer in found else "(not run)"
        print(
            f"  {answer:28} your code: {yours:12} you predicted: {getattr(predictions, answer)!r}"
        )


if __name__ == "__main__":
    main()
