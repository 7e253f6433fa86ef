"""Two engines in one process never see each other's state (the forward context included).

Each engine steps in its own thread, as the message of an engine used from a second thread
advises: every request must get exactly what it gets from an engine of its own, run alone.
A forward context shared by the two (one module global) hands one engine's attention
metadata to the other's layers mid-step, and tokens come out wrong without any error.
"""

from __future__ import annotations

import random
import threading

from mini_vllm import LLM, SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)


def prompts(seed: int, count: int = 6) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randint(5, 60))] for _ in range(count)]


def make_engine() -> LLM:
    return LLM("tiny", max_num_seqs=4, max_model_len=128, max_num_batched_tokens=32)


def test_two_engines_in_two_threads_each_give_their_solo_tokens():
    work = {name: prompts(seed) for name, seed in (("a", 1), ("b", 2))}
    solo_engine = make_engine()
    solo = {
        name: [solo_engine.generate([p], PARAMS, use_tqdm=False)[0].token_ids for p in batch]
        for name, batch in work.items()
    }
    engines = {name: make_engine() for name in work}
    results: dict[str, list] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(work))

    def serve(name: str) -> None:
        try:
            start.wait()
            runs = []
            for _ in range(4):  # several rounds: the two threads' steps interleave
                outputs = engines[name].generate(work[name], PARAMS, use_tqdm=False)
                runs.append([out.token_ids for out in outputs])
            results[name] = runs
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=serve, args=(name,)) for name in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    for name in work:
        for run in results[name]:
            assert run == solo[name], f"engine {name} gave other tokens than alone"
