"""Text <-> token ids, the chat template, and streaming detokenization.

vLLM counterpart: vllm/transformers_utils/tokenizer.py (`get_tokenizer`),
vllm/entrypoints/chat_utils.py (`apply_hf_chat_template`) and
vllm/transformers_utils/detokenizer_utils.py (`detokenize_incrementally`). Hugging
Face: transformers/utils/chat_template_utils.py (`render_jinja_template`).

The tokenizer comes from the same source as the weights. For SmolLM2 that is the
GGUF file: transformers builds a fast tokenizer from the GGUF vocabulary once (slow:
seconds), the loader saves it next to the converted weights as an ordinary Hugging
Face tokenizer directory, and every later run opens `tokenizer.json` with the
`tokenizers` library directly and renders the chat template with jinja2 itself, so
the fast path never imports transformers.

Random-weight models have no tokenizer; `ByteTokenizer` (one id per byte) lets the
CLI drive them anyway.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from mini_vllm.errors import UserError

__all__ = [
    "ByteTokenizer",
    "IncrementalDetokenizer",
    "Tokenizer",
    "TokenizerLike",
    "default_tokenizer",
    "save_tokenizer_from_gguf",
]


class TokenizerLike(Protocol):
    eos_token_id: int | None
    bos_token_id: int | None
    chat_template: str | None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...
    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str: ...


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json stores special tokens as strings or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class Tokenizer:
    """A Hugging Face fast tokenizer (`tokenizer.json`) plus its chat template."""

    def __init__(
        self,
        backend: Any,
        chat_template: str | None = None,
        special_tokens: dict[str, str | None] | None = None,
    ) -> None:
        self._backend = backend
        self.chat_template = chat_template
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.bos_token_id = self._id_of(self.special_tokens.get("bos_token"))
        self.eos_token_id = self._id_of(self.special_tokens.get("eos_token"))

    def _id_of(self, token: str | None) -> int | None:
        return None if token is None else self._backend.token_to_id(token)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Open a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json)."""
        from tokenizers import Tokenizer as FastTokenizer

        path = Path(path)
        backend = FastTokenizer.from_file(str(path / "tokenizer.json"))
        config: dict[str, Any] = {}
        if (path / "tokenizer_config.json").is_file():
            with open(path / "tokenizer_config.json", encoding="utf-8") as f:
                config = json.load(f)
        template = config.get("chat_template")
        if (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        if isinstance(template, list):  # several named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        specials = {
            key: _token_text(config.get(key))
            for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        }
        return cls(backend, template, specials)

    @property
    def vocab_size(self) -> int:
        return self._backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ANCHOR: chat_template
    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        """Render the conversation as the prompt text the model was fine-tuned on.

        Tokenize the result with `add_special_tokens=False`: the template already
        contains every special token it wants.
        """
        if not self.chat_template:
            raise UserError("this tokenizer has no chat template")
        return render_chat_template(
            self.chat_template, messages, add_generation_prompt, **self.special_tokens
        )

    # ANCHOR_END: chat_template


def render_chat_template(
    source: str,
    messages: list[dict[str, str]],
    add_generation_prompt: bool = True,
    **special_tokens: str,
) -> str:
    """Render `messages` with the Jinja chat template `source`, as transformers does."""
    return _compile_template(source).render(
        messages=messages,
        add_generation_prompt=add_generation_prompt,
        tools=None,
        documents=None,
        **special_tokens,
    )


@lru_cache(maxsize=8)
def _compile_template(source: str) -> Any:
    """Compile with the settings transformers uses, so the text matches byte for byte."""
    from datetime import datetime

    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = lambda value, indent=None: json.dumps(
        value, ensure_ascii=False, indent=indent
    )
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class ByteTokenizer:
    """One token per UTF-8 byte (ids 0-255), plus BOS and EOS after them.

    For models with random weights and no tokenizer of their own: the text they
    produce is noise, but the whole path (prompt -> ids -> decode loop -> text) runs.
    Ids the byte table does not cover are shown as `<id>`.
    """

    chat_template = None

    def __init__(self, bos_token_id: int | None = 256, eos_token_id: int | None = 257) -> None:
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        out, pending = [], bytearray()
        for i in ids:
            if 0 <= i < 256:
                pending.append(i)
                continue
            out.append(pending.decode("utf-8", errors="replace"))
            pending.clear()
            if not (skip_special_tokens and i in (self.bos_token_id, self.eos_token_id)):
                out.append(f"<{i}>")
        out.append(pending.decode("utf-8", errors="replace"))
        return "".join(out)

    def apply_chat_template(
        self, messages: list[dict[str, str]], add_generation_prompt: bool = True
    ) -> str:
        raise UserError(
            "the byte tokenizer has no chat template (this model has no tokenizer of its own)"
        )


def default_tokenizer(config: Any) -> ByteTokenizer:
    """The stand-in tokenizer for a model without one: bytes, with the model's BOS/EOS ids.

    Special ids outside the model's vocabulary are dropped rather than handed to it.
    """
    vocab = config.vocab_size
    bos = (
        config.bos_token_id
        if config.bos_token_id is not None and config.bos_token_id < vocab
        else None
    )
    eos_ids = [i for i in config.eos_token_ids if i < vocab]
    return ByteTokenizer(bos_token_id=bos, eos_token_id=eos_ids[0] if eos_ids else None)


# ANCHOR: incremental_detokenizer
class IncrementalDetokenizer:
    """Turn a growing list of token ids into text deltas for streaming.

    Decoding one token at a time is wrong for byte-level BPE: a character may span
    two tokens, and a leading space may depend on the token before. So the last few
    tokens are decoded together and only the text that is complete (no trailing
    U+FFFD, the mark of a cut multi-byte character) is released. vLLM's
    `detokenize_incrementally` keeps the same two offsets.
    """

    def __init__(self, tokenizer: TokenizerLike, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # start of the context decoded along with new tokens
        self.read_offset = 0  # ids before this have been released as text
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (maybe "")."""
        self.ids.append(token_id)
        prefix, full = self._decode_window()
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return ""  # nothing new yet, or a character is still incomplete
        return self._release(prefix, full)

    def flush(self) -> str:
        """At the end of a sequence: release what is left, even a cut character."""
        prefix, full = self._decode_window()
        return self._release(prefix, full) if len(full) > len(prefix) else ""

    def _decode_window(self) -> tuple[str, str]:
        decode = self.tokenizer.decode
        prefix = decode(
            self.ids[self.prefix_offset : self.read_offset],
            skip_special_tokens=self.skip_special_tokens,
        )
        full = decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip_special_tokens)
        return prefix, full

    def _release(self, prefix: str, full: str) -> str:
        delta = full[len(prefix) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += delta
        return delta


# ANCHOR_END: incremental_detokenizer


def save_tokenizer_from_gguf(gguf_path: str | Path, out_dir: str | Path) -> None:
    """Build the tokenizer from a GGUF file with transformers and save it as a HF directory."""
    import transformers
    from transformers import AutoTokenizer

    gguf_path = Path(gguf_path)
    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()  # its GGUF notices are not for our users
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    finally:
        transformers.logging.set_verbosity(verbosity)
    tokenizer.save_pretrained(str(out_dir))
