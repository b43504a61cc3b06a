"""Where the question ends in the needle prompts of the shipped models, and what observation windows see.

SmolLM2-135M-Instruct renders prompts with its chat template; Gemma 3 270M (a base model) has none, so its
prompt is the plain form, whose question is followed only by the answer cue. The tokens after the question
are checked against the instruction, the template's end and the response prefix tokenised on their own.
"""

from __future__ import annotations

import pytest

import headprobe
from headprobe.eval.settings import expand_settings
from headprobe.haystack.context import build_context, question_prompt, response_prefix

pytestmark = pytest.mark.slow


def _template_end(tok) -> str:
    """What the chat template writes after the user's text (``<|im_end|>\\n<|im_start|>assistant\\n``)."""
    text = tok.apply_chat_template([{"role": "user", "content": "MARK"}], tokenize=False, add_generation_prompt=True)
    return text[text.index("MARK") + len("MARK"):]


def _needles(kind):
    return headprobe.load_needles(headprobe.shipped_needle_file(kind))


def _check_tail(tok, needle, template_end: str):
    ctx = build_context(tok, headprobe.load_haystack(), needle, 1000, 0.5, chat_template=True)
    s, e = ctx.question_span
    assert tok.decode(ctx.input_ids[s:e]).strip() == needle.question
    form = ctx.prompt_format
    after = question_prompt(needle, prompt_format=form).split(needle.question, 1)[1] + template_end
    after += response_prefix(needle, form)
    assert ctx.input_ids[e:] == tok(after, add_special_tokens=False)["input_ids"]
    assert ctx.after_question == len(ctx.input_ids) - e and ctx.question_window == len(ctx.input_ids) - s
    return ctx


@pytest.mark.parametrize("kind", ["retrieval", "reasoning"])
def test_where_the_question_ends_under_smollm2s_chat_template(smollm2, kind):
    tok = smollm2.tokenizer
    end = _template_end(tok)
    assert end.startswith("<|im_end|>") and "assistant" in end
    for needle in _needles(kind):
        ctx = _check_tail(tok, needle, end)
        # the last 8 prompt tokens (HeadKV's window) hold none of the question
        assert ctx.after_question >= 8


@pytest.mark.parametrize("kind", ["retrieval", "reasoning"])
def test_where_the_question_ends_in_gemma3s_plain_prompt(gemma3, kind):
    tok = gemma3.tokenizer
    assert not getattr(tok, "chat_template", None)        # base model: the prompt is the plain form
    for needle in _needles(kind):
        ctx = _check_tail(tok, needle, "")
        assert ctx.prompt_format == "plain" and tok.decode(ctx.input_ids[-ctx.after_question:]) == "\nAnswer:"


def test_default_snapkv_window_covers_the_question_of_a_templated_needle_prompt(smollm2):
    """SnapKV's preset window (its published 32 tokens) holds the whole question of a needle prompt in
    SmolLM2's chat template, where HeadKV's 8-token window holds only the instruction's and the template's
    end. Over all shipped retrieval needles it always reaches into the question; for the longest
    questions (15 tokens) it leaves out their first two tokens ("What is"), which ``window=question``
    includes by construction."""
    window = expand_settings(["snapkv"], [128])[0].window()
    tok = smollm2.tokenizer
    hay = headprobe.load_haystack()
    r02 = next(n for n in _needles("retrieval") if n.id == "r02")
    for length in (1000, 8000):
        ctx = build_context(tok, hay, r02, length, 0.5, chat_template=True)
        s, e = ctx.question_span
        last = ctx.input_ids[-window:]
        assert ctx.input_ids[s:e] == last[len(last) - ctx.question_window: len(last) - ctx.after_question]
        assert ctx.question_window <= window
        assert not set(range(s, e)) & set(range(ctx.length - 8, ctx.length))
    for needle in _needles("retrieval"):
        ctx = build_context(tok, hay, needle, 1000, 0.5, chat_template=True)
        assert ctx.after_question < window                       # the question's end is inside
        assert ctx.question_window - window <= 2                 # at most "What is" outside
