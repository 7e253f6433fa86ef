"""`LLM`: the offline-inference entry point, shaped like `vllm.LLM`.

vLLM counterpart: vllm/entrypoints/llm.py (`LLM.__init__` builds the engine from
keyword arguments; `LLM.generate` adds every prompt, steps the engine until all are
done, and returns the outputs in prompt order). nano-vllm: nanovllm/llm.py.

    from mini_vllm import LLM, SamplingParams
    llm = LLM(model="smollm2-135m-instruct", max_num_seqs=8)
    outputs = llm.generate(["The capital of France
    is"], SamplingParams(temperature=0, max_tokens=16))
"""

from __future__ import annotations

from collections.abc import Sequence as SequenceT

from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.engine.llm_engine import LLMEngine
from mini_vllm.engine.sequence import Sequence
from mini_vllm.engine.stats import EngineStats
from mini_vllm.errors import UserError
from mini_vllm.models.loader import load_model
from mini_vllm.outputs import RequestOutput
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.tokenizer import default_tokenizer
from mini_vllm.utils import cpu_threads_context

__all__ = ["LLM"]


class LLM:
    def __init__(self, model: str = "smollm2-135m-instruct", **engine_kwargs: object) -> None:
        config = EngineConfig.from_kwargs(model=model, **engine_kwargs)
        loaded, tokenizer, _ = load_model(
            config.model, device=config.device, dtype=config.dtype, seed=config.seed
        )
        self._build(config, loaded, tokenizer)

    @classmethod
    def from_model(cls, loaded_model, tokenizer=None, **engine_kwargs: object) -> LLM:
        """An engine around a model that is already loaded (no second load from disk).

        The device and dtype default to those of the model's weights; `model=` may name
        where it came from, for messages and statistics.
        """
        weight = next(loaded_model.parameters())
        engine_kwargs.setdefault("device", weight.device.type)
        engine_kwargs.setdefault("dtype", str(weight.dtype).removeprefix("torch."))
        llm = cls.__new__(cls)
        llm._build(
            EngineConfig.from_kwargs(**engine_kwargs),
            loaded_model,
            tokenizer,
            capture_progress=False,
        )
        return llm

    def _build(self, config: EngineConfig, model, tokenizer, capture_progress: bool = True) -> None:
        self.config = config
        self.tokenizer = tokenizer if tokenizer is not None else default_tokenizer(model.config)
        self.engine = LLMEngine(config, model, self.tokenizer, capture_progress=capture_progress)

    @property
    def stats(self) -> EngineStats:
        return self.engine.stats

    def _encode(self, prompt: str | SequenceT[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise UserError(
                    f"model {self.config.model!r} has no "
                    "tokenizer: pass prompts as lists of token ids"
                )
            return prompt, self.tokenizer.encode(prompt)
        return None, [int(t) for t in prompt]

    # ANCHOR: generate
    def generate(
        self,
        prompts: str | SequenceT[str | SequenceT[int]],
        sampling_params: SamplingParams | SequenceT[SamplingParams] | None = None,
        use_tqdm: bool | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt at once (continuous batching); outputs in prompt order.

        A prompt the engine cannot serve (empty, or longer than `max_model_len`) gets an
        output with `finish_reason == "error"` and the reason; the others complete.
        """
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # one prompt, as text or as token ids
        params = sampling_params if sampling_params is not None else SamplingParams()
        params_list = (
            [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        )
        if len(params_list) != len(prompts):
            raise UserError(f"{len(prompts)} prompts but {len(params_list)} SamplingParams")
        if not all(isinstance(p, SamplingParams) for p in params_list):
            raise TypeError("sampling_params must be SamplingParams (or a list of them)")
        encoded = [self._encode(p) for p in prompts]
        # An empty prompt fails alone, with its reason; the others still run.
        seqs = [
            self.engine.add_request(ids, sp) if ids else None
            for (_, ids), sp in zip(encoded, params_list)
        ]

        show = use_tqdm if use_tqdm is not None else len(prompts) >= 8
        progress = None
        if show:
            from tqdm.auto import tqdm

            progress = tqdm(total=len(prompts), desc="generating", unit="req")
            progress.update(sum(1 for s in seqs if s is None))
        with cpu_threads_context(self.engine.runner.device, self.config.cpu_threads):
            while self.engine.has_unfinished_requests():
                finished = self.engine.step()
                if progress is not None and finished:
                    progress.update(len(finished))
        if progress is not None:
            progress.close()
        return [
            self._output(seq, text) if seq is not None else self._empty_prompt_output(text)
            for seq, (text, _) in zip(seqs, encoded)
        ]

    # ANCHOR_END: generate

    def _empty_prompt_output(self, prompt: str | None) -> RequestOutput:
        self.engine.stats.num_failed_requests += 1
        return RequestOutput(
            request_id=-1,
            prompt=prompt,
            prompt_token_ids=[],
            text="",
            token_ids=[],
            finish_reason="error",
            error="the prompt is empty (no tokens): give at least one token",
        )

    def _output(self, seq: Sequence, prompt: str | None) -> RequestOutput:
        tokens = list(seq.output_token_ids)
        text = self.tokenizer.decode(tokens) if self.tokenizer is not None else ""
        return RequestOutput(
            request_id=seq.seq_id,
            prompt=prompt,
            prompt_token_ids=list(seq.prompt_token_ids),
            text=text,
            token_ids=tokens,
            finish_reason=seq.finish_reason.value,
            error=seq.error,
        )
