"""The two forms a prompt is rendered in: the model's chat template, or plain text ending with an answer cue.

``chat``
    The document, the question and the answer instruction are the user's turn of the tokenizer's chat
    template, whose generation prompt (``<|im_start|>assistant``) starts the response.
``plain``
    For base models, which have no chat template, and for ``--prompt-format plain``: the document, the answer
    instruction, the question and the cue ``Answer:``, with nothing after the cue::

        <document>

        Answer in a short phrase, based on the document above.
        Question: What is the access code for the east storeroom?
        Answer:

    A base model continues the text it is given; without the cue it goes on writing the document (another
    ``Question:``, another heading). This is the common form of the base-model prompts of the needle and
    long-context papers: Retrieval_Head's and HeadKV's needle probes end with
    ``Based on the content of the book, Question: {question}\\nAnswer:``, and LongBench's question-answering
    prompts (``config/dataset2prompt.json``) with an instruction, then ``Question: {input}\\nAnswer:``.
    The model's response starts after the cue (``" 5829"``): the probes score the steps from the cue on,
    and the cue is a response prefix of the prompt (:attr:`~headprobe.haystack.context.TrialContext.response_prefix`).

Which form a run uses is decided once (:func:`resolve_prompt_format`): ``auto`` takes the chat template
when the tokenizer has one and the plain form otherwise. Trial logs, profiles, eval results and ablation
results record the form as ``prompt_format`` (``"chat"`` or ``"plain"``); a run is not resumed, and shards
are not merged, across forms.
"""

from __future__ import annotations

from typing import Any

from ..errors import HeadprobeError, param

#: What a run may ask for; files record the resolved form, ``"chat"`` or ``"plain"``.
PROMPT_FORMATS = ("auto", "chat", "plain")

#: The last text of a plain prompt: the model's answer follows it.
ANSWER_CUE = "Answer:"


def has_chat_template(tokenizer: Any) -> bool:
    """Whether the tokenizer carries a chat template."""
    return bool(getattr(tokenizer, "chat_template", None))


def check_prompt_format(requested: str, chat_template: bool = True) -> None:
    """Refuse an unknown form, and the chat form together with ``chat_template=False``.

    Raises
    ------
    HeadprobeError
        Naming ``prompt_format`` (and ``chat_template``).
    """
    if requested not in PROMPT_FORMATS:
        raise HeadprobeError(f"{param('prompt_format', requested)}: expected one of {', '.join(PROMPT_FORMATS)}")
    if requested == "chat" and not chat_template:
        raise HeadprobeError(f"{param('prompt_format', 'chat')} and {param('chat_template', False)} contradict "
                             "each other; give one of them")


def wants_chat_template(requested: str = "auto", chat_template: bool = True) -> bool:
    """The ``chat_template`` switch of the prompt builders for a requested form: ``False`` for ``plain``
    (or when ``chat_template`` is already off), else ``True`` (the template is applied when the tokenizer
    has one)."""
    check_prompt_format(requested, chat_template)
    return chat_template and requested != "plain"


def prompt_format_of(tokenizer: Any, chat_template: bool = True) -> str:
    """The form the prompt builders render with ``chat_template`` on this tokenizer: ``"chat"`` when it is
    on and the tokenizer has a template, else ``"plain"``."""
    return "chat" if chat_template and has_chat_template(tokenizer) else "plain"


def resolve_prompt_format(tokenizer: Any, requested: str = "auto", chat_template: bool = True) -> str:
    """The form a run uses: ``"chat"`` or ``"plain"``.

    Parameters
    ----------
    tokenizer
        The model's tokenizer.
    requested
        ``"auto"`` (chat template when the tokenizer has one, else plain), ``"chat"`` or ``"plain"``.
    chat_template
        ``False`` (``--no-chat-template``) is the same as ``requested="plain"``.

    Raises
    ------
    HeadprobeError
        An unknown form, ``chat`` together with ``chat_template=False``, or ``chat`` for a tokenizer
        without a chat template.
    """
    use = wants_chat_template(requested, chat_template)
    if requested == "chat" and not has_chat_template(tokenizer):
        raise HeadprobeError(f"{param('prompt_format', 'chat')}: the model's tokenizer has no chat template (a base "
                             f"model); use {param('prompt_format', 'plain')} or {param('prompt_format', 'auto')}")
    return prompt_format_of(tokenizer, use)


def plain_question(instruction: str, question: str) -> str:
    """The text after the document in the plain form, up to the cue: the instruction, then the question.

    The prompt is ``document + "\\n\\n" + plain_question(...) + ANSWER_CUE``.
    """
    return f"{instruction}\nQuestion: {question}\n"
