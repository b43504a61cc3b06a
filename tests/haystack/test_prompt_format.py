"""The two prompt forms: the chat template, and the plain form that ends with the answer cue ``Answer:``.

A base model continues the text it is given, so a plain prompt must end where an answer starts; the
response the probes score (teacher-forced or decoded) starts right after that cue.
"""

from __future__ import annotations

import pytest
from conftest import _tiny_tokenizer

import headprobe
from headprobe import HeadprobeError
from headprobe.eval.datasets import QAExample, qa_prompt_ids
from headprobe.haystack.context import build_context, render_instruction_prompt, response_tokens
from headprobe.haystack.prompt_format import (
    ANSWER_CUE,
    prompt_format_of,
    resolve_prompt_format,
    wants_chat_template,
)
from headprobe.haystack.tasks import load_tasks
from headprobe.probes.fast_mode import build_batch
from headprobe.probes.retention import RetentionConfig, task_prompt_ids
from headprobe.probes.trial_grid import TrialSpec

#: A minimal chat template: the user's turn between markers, then the assistant's marker.
CHAT_TEMPLATE = ("{% for m in messages %}<s>user: {{ m['content'] }}</s>{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant:{% endif %}")


@pytest.fixture(scope="module")
def tok():
    return _tiny_tokenizer()


@pytest.fixture(scope="module")
def chat_tok():
    tok = _tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    return tok


def _needle(kind: str):
    return headprobe.load_needles(headprobe.shipped_needle_file(kind))[0]


@pytest.mark.parametrize("kind", ["retrieval", "reasoning", None])
def test_a_plain_prompt_ends_with_the_cue(tok, kind):
    needle = _needle(kind) if kind else None
    ctx = build_context(tok, headprobe.load_haystack(), needle, 400, 0.5, chat_template=False)
    assert ctx.prompt_format == "plain" and ctx.response_prefix == ANSWER_CUE
    assert ctx.text.endswith(f"\nQuestion: {needle.question if needle else ''}\n{ANSWER_CUE}")
    instruction = ("Answer with skateboarding or birdwatching only" if kind == "reasoning"
                   else "Answer in a short phrase")
    assert f"\n\n{instruction}, based on the document above.\nQuestion: " in ctx.text
    assert ctx.length <= 400
    if needle is not None:
        # nothing follows the cue: the last prompt tokens are the line break and the cue, after the question
        assert tok.decode(ctx.input_ids[ctx.length - ctx.after_question:]) == f"\n{ANSWER_CUE}"
        assert tok.decode(ctx.input_ids[slice(*ctx.question_span)]).strip() == needle.question


def test_a_tokenizer_without_a_chat_template_gets_the_plain_form_even_when_the_template_is_wanted(tok):
    ctx = build_context(tok, headprobe.load_haystack(), _needle("retrieval"), 400, 0.5, chat_template=True)
    assert ctx.prompt_format == "plain" and ctx.text.endswith(ANSWER_CUE)


@pytest.mark.parametrize("kind", ["retrieval", "reasoning"])
def test_the_scored_response_starts_after_the_cue(tok, kind):
    """The answer tokens the probes score are those that follow the whole prompt, cue included: the prompt
    with the answer appended tokenises to the prompt's ids and then exactly these."""
    needle = _needle(kind)
    hay = headprobe.load_haystack()
    for depth in (0.0, 0.5, 1.0):
        ctx = build_context(tok, hay, needle, 400, depth, chat_template=False)
        gold = response_tokens(tok, ctx, needle.answer)
        whole = tok(f"{ctx.text} {needle.answer}")["input_ids"]
        assert whole[:ctx.length] == ctx.input_ids
        assert whole[ctx.length:] == gold
        assert tok.decode(gold).strip() == needle.answer
        # fast mode teacher-forces these tokens from the prompt's last position (the cue's last token)
        batch = build_batch(tok, [TrialSpec(length=400, seed=0, depth=depth, needle_id=needle.id)], [ctx], ctx.length - 1, {needle.id: needle})
        assert batch.variants[0]["gold"] == gold
        assert int(batch.prompt_len[0]) == ctx.length
        assert tok.decode(ctx.input_ids[ctx.length - ctx.after_question:]) == f"\n{ANSWER_CUE}"


def test_the_chat_form_has_no_cue(chat_tok):
    needle = _needle("retrieval")
    ctx = build_context(chat_tok, headprobe.load_haystack(), needle, 400, 0.5, chat_template=True)
    assert ctx.prompt_format == "chat" and ctx.response_prefix == ""
    assert ctx.text.endswith(f"Question: {needle.question}\nAnswer in a short phrase, based on the document "
                             "above.</s><s>assistant:")
    plain = build_context(chat_tok, headprobe.load_haystack(), needle, 400, 0.5, chat_template=False)
    assert plain.prompt_format == "plain" and plain.text.endswith(ANSWER_CUE) and "assistant:" not in plain.text
    reasoning = build_context(chat_tok, headprobe.load_haystack(), _needle("reasoning"), 400, 0.5)
    assert reasoning.text.endswith("<s>assistant:The answer is:")


def test_task_and_dataset_prompts_end_with_the_cue_in_the_plain_form(tok, chat_tok):
    sample = load_tasks(["single_doc_qa"], samples_per_task=1)["single_doc_qa"][0]
    text, add_special = render_instruction_prompt(tok, "Some text.", "Name the colour.", chat_template=True)
    assert (text, add_special) == (f"Some text.\n\nName the colour.\n{ANSWER_CUE}", True)
    chat_text, chat_special = render_instruction_prompt(chat_tok, "Some text.", "Name the colour.", True)
    assert chat_text == "<s>user: Some text.\n\nName the colour.</s><s>assistant:" and not chat_special
    ids = task_prompt_ids(tok, sample, RetentionConfig(max_tokens=4000))
    assert tok.decode(ids).endswith(f"{sample.instruction}\n{ANSWER_CUE}")
    row = QAExample("q", "The notebook was red. " * 40, "What colour was the notebook?", ("red",))
    for limit in (2000, 120):                                   # whole, and cut in the middle
        ids = qa_prompt_ids(tok, row, limit, chat_template=True)
        assert tok.decode(ids).endswith("Answer in a short phrase, based on the text above.\n"
                                        f"Question: What colour was the notebook?\n{ANSWER_CUE}")
        assert len(ids) <= limit
    assert tok.decode(qa_prompt_ids(chat_tok, row, 2000)).endswith(
        "Question: What colour was the notebook?\nAnswer in a short phrase, based on the text above.</s><s>assistant:")


def test_the_form_is_chosen_automatically_and_can_be_overridden(tok, chat_tok):
    assert resolve_prompt_format(chat_tok) == "chat" and resolve_prompt_format(tok) == "plain"
    assert resolve_prompt_format(chat_tok, "plain") == "plain"
    assert resolve_prompt_format(chat_tok, "auto", chat_template=False) == "plain"
    assert resolve_prompt_format(chat_tok, "chat") == "chat"
    assert prompt_format_of(chat_tok, True) == "chat" and prompt_format_of(tok, True) == "plain"
    assert wants_chat_template("plain") is False and wants_chat_template("auto") is True
    assert wants_chat_template("auto", chat_template=False) is False


def test_impossible_forms_are_refused(tok, chat_tok):
    with pytest.raises(HeadprobeError, match="prompt_format='chat': the model's tokenizer has no chat template"):
        resolve_prompt_format(tok, "chat")
    with pytest.raises(HeadprobeError, match="prompt_format='chat' and chat_template=False contradict"):
        resolve_prompt_format(chat_tok, "chat", chat_template=False)
    with pytest.raises(HeadprobeError, match="prompt_format='chatml': expected one of auto, chat, plain"):
        wants_chat_template("chatml")
