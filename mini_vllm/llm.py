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

import dataclasses
import time
from collections.abc import Sequence as SequenceT

from mini_vllm.engine.engine_config import EngineConfig
from mini_vllm.engine.kv_cache_plan import device_memory, plan_kv_cache
from mini_vllm.engine.llm_engine import LLMEngine
from mini_vllm.engine.sequence import Sequence
from mini_vllm.engine.stats import EngineStats
from mini_vllm.errors import UserError
from mini_vllm.executor import Executor, make_executor
from mini_vllm.models.loader import load_model, load_model_config, resolve_device, resolve_dtype
from mini_vllm.outputs import CompletionOutput, Logprob, RequestOutput, logprob_entry
from mini_vllm.sampling_params import SamplingParams
from mini_vllm.tokenizer import (
    IncrementalDetokenizer,
    default_tokenizer,
    render_chat_template,
)
from mini_vllm.utils import OneCallerAtATime, cpu_threads_context

__all__ = ["LLM"]


class LLM:
    def __init__(self, model: str = "smollm2-135m-instruct", **engine_kwargs: object) -> None:
        config = EngineConfig.from_kwargs(model=model, **engine_kwargs)
        # The KV cache is checked against the model's shape before the weights load.
        device = resolve_device(config.device)
        model_config = load_model_config(config.model)
        config.check_tensor_parallel(model_config)
        dtype = resolve_dtype(config.dtype, device)
        memory = device_memory(device)
        if device.type == "cuda":  # the weights load next: count them as held already
            # (a rank's shard: every matrix is split over the ranks, only the norms are not)
            weight_bytes = model_config.num_parameters() * dtype.itemsize
            memory["in_use_bytes"] += weight_bytes // config.tensor_parallel_size
        plan_kv_cache(config, model_config, dtype, device, **memory)
        start = time.perf_counter()
        # Tensor parallelism: the other ranks start now and load their shards meanwhile (or,
        # under a launcher, every rank is a process like this one, loading its own).
        executor = make_executor(config)
        try:
            loaded, tokenizer, _ = load_model(
                config.model,
                device=executor.device if executor else config.device,
                dtype=config.dtype,
                seed=config.seed,
                custom_ops=config.custom_ops,
            )
            if executor is not None:
                executor.wait_for_workers_loaded()
            # Seconds to build the model and fill its weights (vLLM logs "Model loading took").
            self.load_seconds = time.perf_counter() - start
            self._build(config, loaded, tokenizer, model_executor=executor)
        except BaseException:
            if executor is not None:
                executor.shutdown()
            raise

    @classmethod
    def from_model(cls, loaded_model, tokenizer=None, **engine_kwargs: object) -> LLM:
        """An engine around a model that is already loaded (no second load from disk).

        The device and dtype default to those of the model's weights; `model=` may name
        where it came from, for messages and statistics.
        """
        if engine_kwargs.get("tensor_parallel_size", 1) != 1:
            raise UserError(
                "LLM.from_model runs the model it is given, in this process: "
                "tensor_parallel_size > 1 needs LLM(model_name, tensor_parallel_size=N), "
                "which loads each rank's shard"
            )
        weight = next(loaded_model.parameters())
        engine_kwargs.setdefault("device", weight.device.type)
        engine_kwargs.setdefault("dtype", str(weight.dtype).removeprefix("torch."))
        llm = cls.__new__(cls)
        llm.load_seconds = 0.0  # it came loaded
        llm._build(
            EngineConfig.from_kwargs(**engine_kwargs),
            loaded_model,
            tokenizer,
            capture_progress=False,
        )
        return llm

    def _build(
        self,
        config: EngineConfig,
        model,
        tokenizer,
        capture_progress: bool = True,
        model_executor: Executor | None = None,
    ) -> None:
        self.config = config
        self.tokenizer = tokenizer if tokenizer is not None else default_tokenizer(model.config)
        self.engine = LLMEngine(
            config,
            model,
            self.tokenizer,
            capture_progress=capture_progress,
            model_executor=model_executor,
        )
        self._one_caller = OneCallerAtATime(
            "LLM.generate",
            advice="use one LLM per thread, or one thread that owns the LLM and takes prompts "
            "from the others",
        )

    @property
    def stats(self) -> EngineStats:
        return self.engine.stats

    # ANCHOR: generate
    def generate(
        self,
        prompts: str | SequenceT[int] | SequenceT[str | SequenceT[int]],
        sampling_params: SamplingParams | SequenceT[SamplingParams] | None = None,
        use_tqdm: bool | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt at once (continuous batching); outputs in prompt order.

        A prompt is text (str) or a list of token ids. One the engine cannot serve
        (empty, token ids outside the vocabulary, `max_model_len` tokens or more) gets an
        output with `finish_reason == "error"` and the reason; the others complete. A
        prompt of another type, or a sampling_params list of the wrong length, raises
        UserError before any prompt is queued. If the call raises or is interrupted,
        the requests it queued are aborted, and the engine is ready for the next call.
        An LLM serves one call at a time: a call from a second thread is refused.
        """
        with self._one_caller:
            prompts = self._as_prompt_list(prompts)
            params = self._as_params_list(sampling_params, len(prompts))
            checked = [self._check_prompt(i, prompt) for i, prompt in enumerate(prompts)]
            if self.tokenizer is None and any(sp.stop for sp in params):
                raise UserError(
                    f"{self.config.model!r} has no tokenizer, so there is no text to find stop "
                    "strings in; use stop_token_ids instead"
                )
            children: list[list[Sequence]] = []  # a prompt's n sequences ([]: refused)
            progress = self._progress_bar(use_tqdm, len(prompts))
            try:
                for (_, ids, error), sp in zip(checked, params):
                    if error is not None:
                        children.append([])
                        continue
                    # n > 1: n requests of the same prompt (prefix caching, when on, shares
                    # its blocks), each with its own draw: a seeded one gets seed + index,
                    # as vLLM's parallel sampling does.
                    children.append(
                        [self.engine.add_request(ids, child) for child in sampling_children(sp)]
                    )
                seqs = [seq for family in children for seq in family]
                if progress is not None:
                    progress.update(sum(1 for family in children if not family))
                # Only the requests with stop strings are decoded as they grow.
                watched = {
                    seq.seq_id: StopStringWatch(self.tokenizer, seq)
                    for seq in seqs
                    if seq.sampling_params.stop
                }
                watching = list(watched.values())
                with cpu_threads_context(self.engine.runner.device, self.config.cpu_threads):
                    while self.engine.has_unfinished_requests():
                        finished = self.engine.step()
                        for watch in watching:
                            # Also on the step that ended it otherwise: a stop string in
                            # its last tokens still cuts the text there.
                            if watch.reached_stop() and not watch.seq.is_finished:
                                finished += [self.engine.stop_request(watch.seq.seq_id)]
                        watching = [w for w in watching if not w.seq.is_finished]
                        if progress is not None and finished:
                            progress.update(len(finished))
            finally:
                # All or nothing: what this call queued and did not finish must not stay
                # in the engine, holding blocks and running inside the next call.
                unfinished = [s for family in children for s in family if not s.is_finished]
                self.engine.abort_request([s.seq_id for s in unfinished])
                if progress is not None:
                    progress.close()
            return [
                self._output(family, text, watched)
                if family
                else self._error_output(text, ids, error)
                for family, (text, ids, error) in zip(children, checked)
            ]

    # ANCHOR_END: generate

    # ANCHOR: chat
    def chat(
        self,
        messages: SequenceT[dict[str, str]] | SequenceT[SequenceT[dict[str, str]]],
        sampling_params: SamplingParams | SequenceT[SamplingParams] | None = None,
        use_tqdm: bool | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Generate the assistant's reply to one conversation, or to each of several
        (vLLM's `LLM.chat`): each is rendered with the model's chat template (or
        `chat_template`, a Jinja source) and generated as `generate` does."""
        conversations = _as_conversations(messages)
        if self.tokenizer is None:
            raise UserError(
                f"{self.config.model!r} has no tokenizer, so it cannot render a conversation; "
                "give token ids to generate() instead"
            )
        template = chat_template or getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise UserError(
                f"{self.config.model!r} has no chat template: pass chat_template= (a Jinja "
                "source), or use generate() with the prompt text"
            )
        specials = getattr(self.tokenizer, "special_tokens", {})
        prompts = [
            self.tokenizer.encode(
                render_chat_template(template, list(c), add_generation_prompt, **specials),
                add_special_tokens=False,  # the template holds every special token it wants
            )
            for c in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    # ANCHOR_END: chat

    @staticmethod
    def _as_prompt_list(prompts: object) -> list:
        if isinstance(prompts, str):
            return [prompts]  # one prompt, as text
        if isinstance(prompts, (bytes, bytearray)) or not isinstance(prompts, SequenceT):
            raise UserError(
                "prompts must be a str, a list of token ids, or a list of those; got "
                f"{type(prompts).__name__}"
            )
        if prompts and all(isinstance(p, int) and not isinstance(p, bool) for p in prompts):
            return [prompts]  # one prompt, as token ids
        return list(prompts)

    @staticmethod
    def _as_params_list(sampling_params: object, count: int) -> list[SamplingParams]:
        params = sampling_params if sampling_params is not None else SamplingParams()
        params_list = [params] * count if isinstance(params, SamplingParams) else params
        if isinstance(params_list, (str, bytes)) or not isinstance(params_list, SequenceT):
            raise UserError(
                "sampling_params must be a SamplingParams or a list of them, "
                f"got {type(sampling_params).__name__}"
            )
        if len(params_list) != count:
            raise UserError(f"{count} prompts but {len(params_list)} SamplingParams")
        wrong = [i for i, p in enumerate(params_list) if not isinstance(p, SamplingParams)]
        if wrong:
            raise UserError(
                f"sampling_params[{wrong[0]}] is a {type(params_list[wrong[0]]).__name__}, "
                "not a SamplingParams"
            )
        return list(params_list)

    def _check_prompt(self, index: int, prompt: object) -> tuple[str | None, list[int], str | None]:
        """(text or None, token ids, why the engine cannot serve it or None)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise UserError(
                    f"model {self.config.model!r} has no tokenizer: pass prompts as lists of "
                    "token ids"
                )
            text, ids = prompt, self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple, range)) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in prompt
        ):
            text, ids = None, list(prompt)
        else:
            raise UserError(
                f"prompt {index} is a {type(prompt).__name__}: a prompt is a str or a list of "
                "token ids (ints)"
            )
        try:
            return text, self.engine.check_prompt(ids), None
        except UserError as exc:
            return text, ids, str(exc)

    @staticmethod
    def _progress_bar(use_tqdm: bool | None, total: int):
        if not (use_tqdm if use_tqdm is not None else total >= 8):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=total, desc="generating", unit="req")

    def _error_output(self, prompt: str | None, ids: list[int], error: str) -> RequestOutput:
        self.engine.stats.num_failed_requests += 1
        return RequestOutput(
            request_id=-1,
            prompt=prompt,
            prompt_token_ids=ids,
            outputs=[CompletionOutput(index=0, text="", token_ids=[], finish_reason="error")],
            error=error,
        )

    def _logprobs(self, seq: Sequence, count: int) -> tuple[list | None, float | None]:
        """vLLM's per-token `{id: Logprob}` dicts (the token and its alternatives) and
        their sum, for a request that asked for log-probabilities."""
        if seq.sampling_params.logprobs is None:
            return None, None

        per_token, total = [], 0.0
        for place in range(count):
            per_token.append(self._logprob_entry(seq.token_logprobs[place]))
            total += seq.token_logprobs[place][1]
        return per_token, total

    def _logprob_entry(self, kept: tuple) -> dict[int, Logprob]:
        tokenizer = self.tokenizer
        return logprob_entry(kept, None if tokenizer is None else lambda t: tokenizer.decode([t]))

    def _prompt_logprobs(self, seq: Sequence) -> list[dict[int, Logprob] | None] | None:
        if seq.sampling_params.prompt_logprobs is None:
            return None
        kept = seq.prompt_logprobs
        return [None] + [
            self._logprob_entry(kept[p]) if p in kept else None
            for p in range(1, seq.num_prompt_tokens)
        ]

    def _output(
        self,
        children: list[Sequence],
        prompt: str | None,
        watched: dict[object, StopStringWatch],
    ) -> RequestOutput:
        """One prompt's output: a completion for each of its `n` sequences."""
        first = children[0]
        completions = [
            self._completion(seq, index, watched.get(seq.seq_id))
            for index, seq in enumerate(children)
        ]
        errors = [seq.error for seq in children if seq.error]
        return RequestOutput(
            request_id=first.seq_id,
            prompt=prompt,
            prompt_token_ids=list(first.prompt_token_ids),
            outputs=completions,
            error=errors[0] if errors else None,
            prompt_logprobs=self._prompt_logprobs(first),
        )

    def _completion(
        self, seq: Sequence, index: int, watch: StopStringWatch | None
    ) -> CompletionOutput:
        tokens = list(seq.output_token_ids)
        logprobs, cumulative = self._logprobs(seq, len(tokens))
        if watch is not None and watch.stop_string is not None:
            text, reason, stop_reason = watch.text, "stop", watch.stop_string
        else:
            text = self.tokenizer.decode(tokens) if self.tokenizer is not None else ""
            params, reason = seq.sampling_params, seq.finish_reason.value
            last = tokens[-1] if tokens else None
            eos = self.engine.scheduler.eos_token_ids
            # A stop token (not EOS) is the stop's reason; EOS has none, as in vLLM.
            by_stop_token = last in params.stop_token_ids and (params.ignore_eos or last not in eos)
            stop_reason = last if reason == "stop" and by_stop_token else None
        return CompletionOutput(
            index=index,
            text=text,
            token_ids=tokens,
            finish_reason=reason,
            stop_reason=stop_reason,
            cumulative_logprob=cumulative,
            logprobs=logprobs,
        )


def sampling_children(params: SamplingParams) -> list[SamplingParams]:
    """The sampling of each of a request's `n` completions (the server's choices too)."""
    if params.n == 1:
        return [params]
    return [
        dataclasses.replace(params, n=1, seed=None if params.seed is None else params.seed + i)
        for i in range(params.n)
    ]


def _as_conversations(messages: object) -> list[list[dict[str, str]]]:
    """One conversation (a list of {"role", "content"} dicts) or a list of them."""
    if isinstance(messages, SequenceT) and messages and isinstance(messages[0], dict):
        conversations = [messages]
    elif isinstance(messages, SequenceT) and not isinstance(messages, (str, bytes)):
        conversations = list(messages)
    else:
        conversations = []
    if not conversations or not all(
        isinstance(c, SequenceT)
        and c
        and all(isinstance(m, dict) and {"role", "content"} <= m.keys() for m in c)
        for c in conversations
    ):
        raise UserError(
            "chat() takes a conversation, a list of {'role': ..., 'content': ...} messages, "
            "or a list of such conversations"
        )
    return [list(c) for c in conversations]


# ANCHOR: stop_strings
class StopStringWatch:
    """A request's text, decoded as its tokens arrive, and the stop string it reached.

    vLLM checks stop strings in its detokenizer (`check_stop_strings` in
    vllm/v1/engine/detokenizer.py): each new piece of text is searched, together with the
    few characters before it that a stop string could begin in.
    """

    def __init__(self, tokenizer, seq: Sequence) -> None:
        self.seq = seq
        self.detokenizer = IncrementalDetokenizer(tokenizer)
        self.stop_string: str | None = None
        self.text = ""  # the text to return once stopped (cut at the stop string)
        self._longest = max(len(stop) for stop in seq.sampling_params.stop)

    def reached_stop(self) -> bool:
        seq, params = self.seq, self.seq.sampling_params
        ready = seq.num_output_tokens - seq.num_output_placeholders  # in flight: not yet
        start = seq.num_prompt_tokens + len(self.detokenizer.ids)
        for token in seq.tokens(start, seq.num_prompt_tokens + ready):
            before = len(self.detokenizer.text)
            self.detokenizer.push(token)
            text = self.detokenizer.text
            window = max(0, before - self._longest + 1)
            found = [(text.find(stop, window), stop) for stop in params.stop]
            found = [(at, stop) for at, stop in found if at >= 0]
            if found:
                at, stop = min(found)
                self.stop_string = stop
                self.text = (
                    text[: at + len(stop)] if params.include_stop_str_in_output else text[:at]
                )
                return True
        return False


# ANCHOR_END: stop_strings
