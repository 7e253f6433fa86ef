"""How the commands declare their options: one line an option, its default shown in its help."""

from __future__ import annotations

import argparse


def option(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    flag: str,
    help: str,
    **kwargs: object,
) -> None:
    """`parser.add_argument(flag, help=help, **kwargs)`; a default other than None or False
    is added to the help, as "(default: ...)"."""
    default = kwargs.get("default")
    if default is not None and default is not False and "action" not in kwargs:
        help = f"{help} (default: %(default)s)"
    parser.add_argument(flag, help=help, **kwargs)


MODEL_HELP = (
    "smollm2-135m-instruct (real weights), tiny, smollm2-135m, llama-3.2-1b-like, "
    "llama-3.1-8b-like (random weights), or a Hugging Face model directory"
)
DTYPE_HELP = "auto (float32 on CPU, bfloat16 on GPU), float32, bfloat16 or float16"


def model_options(
    parser: argparse.ArgumentParser, model: str = "smollm2-135m-instruct", dtype: bool = True
) -> None:
    """--model, --device and (unless `dtype` is False) --dtype, as every command names them."""
    option(parser, "--model", MODEL_HELP, default=model)
    option(parser, "--device", "cpu or cuda", default="cpu")
    if dtype:
        option(parser, "--dtype", DTYPE_HELP, default="auto")
