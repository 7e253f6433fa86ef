"""`LLM.generate` and `LLM.chat` return vLLM's output shape: `RequestOutput.outputs`, a
list of `CompletionOutput`, so the first line of every vLLM example works here."""

from __future__ import annotations

import pytest

from mini_vllm import LLM, CompletionOutput, RequestOutput, SamplingParams
from mini_vllm.errors import UserError

TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
PARAMS = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_num_seqs=4, max_model_len=128)


def test_generate_returns_vllms_shape(llm):
    (out,) = llm.generate([[5, 6, 7]], PARAMS, use_tqdm=False)
    assert isinstance(out, RequestOutput) and out.finished
    (completion,) = out.outputs
    assert isinstance(completion, CompletionOutput) and completion.index == 0
    assert len(completion.token_ids) == 8 and completion.finish_reason == "length"
    assert completion.finished() and completion.stop_reason is None
    # The request's own shortcuts are its one completion's.
    assert (out.token_ids, out.text, out.finish_reason) == (
        completion.token_ids,
        completion.text,
        completion.finish_reason,
    )


def test_a_refused_prompt_has_one_error_completion(llm):
    (out,) = llm.generate([[]], PARAMS, use_tqdm=False)
    assert out.outputs[0].finish_reason == "error" and out.outputs[0].token_ids == []
    assert out.error and not out.ok


def test_chat_renders_the_conversation_and_generates_as_generate_does(llm):
    conversation = [{"role": "user", "content": "hi"}]
    text = "user: hi\nassistant:"
    (reply,) = llm.chat(conversation, PARAMS, use_tqdm=False, chat_template=TEMPLATE)
    (direct,) = llm.generate(
        [llm.tokenizer.encode(text, add_special_tokens=False)], PARAMS, use_tqdm=False
    )
    assert reply.outputs[0].token_ids == direct.outputs[0].token_ids
    two = llm.chat([conversation, conversation], PARAMS, use_tqdm=False, chat_template=TEMPLATE)
    assert [o.token_ids for o in two] == [reply.token_ids] * 2


@pytest.mark.parametrize("bad", ["hi", [], [{"role": "user"}], [[]]])
def test_chat_refuses_what_is_not_a_conversation(llm, bad):
    with pytest.raises(UserError, match="conversation"):
        llm.chat(bad, PARAMS, chat_template=TEMPLATE)
