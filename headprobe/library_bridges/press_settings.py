"""kvpress's presses as eval settings (``kvpress:PRESS[OPTIONS]@CAPACITY``), run by kvpress's own pipeline.

A ``kvpress:`` setting answers each prompt through kvpress's ``KVPressTextGenerationPipeline`` (its
``forward``: the context prefilled under the press, then the question and a greedy answer on the
compressed ``DynamicCache``), on the same token ids every headprobe setting of the run gets: the prompt is
split where its question starts, the tokens before are kvpress's *context* (compressed), the rest its
*question* (kept whole), as kvpress's pipeline splits a prompt. With the setting option
``compress_questions=true`` (kvpress's evaluation flag) the question is part of the context and only what
follows it is kept whole.

At a capacity ``C`` (tokens per KV head, as every headprobe setting) a press removes the share of the
context that leaves ``C`` prompt tokens per head, question included: ``keep = C - question`` context
tokens, passed to kvpress as ``compression_ratio = 1 - (keep + 0.5) / context`` (kvpress keeps
``int(context * (1 - ratio))``, so exactly ``keep``). Rows of one run therefore line up at equal kept
tokens; the ratio each prompt ran at is in its trial (``compression_ratio``).

What a trial records beside the answer: the bytes kvpress's cache really held (a scorer press shortens the
cache; a head-wise press such as ``AdaKVPress`` or ``DuoAttentionPress`` masks keys in a full cache, so its
bytes are the full cache's) and ``attended_tokens``, the prompt tokens a KV head attends while decoding, as
a mean over layers and heads (masked keys left out; sliding-window layers left out, as in headprobe's rows).

A model with sliding-window layers (Gemma 3) gets the cache transformers builds for it (each sliding layer
keeps its window), and a press compresses only the layers that attend every token: kvpress's own rule for
Gemma 3, which kvpress applies to ``Gemma3ForConditionalGeneration`` only, applied to the text-only
``Gemma3ForCausalLM`` as well (:func:`pass_over_sliding_layers`). headprobe's settings compress the same
layers.

kvpress is imported only inside the functions that build or run a press: importing it patches
transformers' attention functions for the whole process.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import version
from typing import TYPE_CHECKING, Any

from ..errors import HeadprobeError, param

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..models.loading import LoadedModel

#: The eval-setting policy name of a kvpress setting (``kvpress:PRESS``).
KVPRESS = "kvpress"


@dataclass(frozen=True)
class PressSpec:
    """How a ``kvpress:`` setting's press is built.

    Attributes
    ----------
    cls
        The kvpress class (its name in ``kvpress``; the pattern-folder press lives in
        :mod:`headprobe.library_bridges.kvpress`).
    inner
        For a press over a scorer press (``AdaKVPress``; ``BlockPress``, kvpress's block-by-block scoring, the
        way KeyDiff's paper prefills): the inner press's class; options go to whichever of the two declares them.
    ratio
        Whether the press takes a ``compression_ratio`` (then the setting has capacities); ``False`` for no
        press and for a press whose pattern decides what it keeps (DuoAttention), run once like ``full``.
    """

    cls: str | None
    inner: str | None = None
    ratio: bool = True


#: ``kvpress:NAME`` → the press it runs. ``none`` is kvpress's pipeline without a press.
PRESSES: dict[str, PressSpec] = {
    "none": PressSpec(None, ratio=False),
    "snapkv": PressSpec("SnapKVPress"),
    "pyramidkv": PressSpec("PyramidKVPress"),
    "streaming": PressSpec("StreamingLLMPress"),
    "expected_attention": PressSpec("ExpectedAttentionPress"),
    "adakv": PressSpec("AdaKVPress", inner="SnapKVPress"),
    "keydiff": PressSpec("KeyDiffPress"),
    "block_keydiff": PressSpec("BlockPress", inner="KeyDiffPress"),
    "knorm": PressSpec("KnormPress"),
    "tova": PressSpec("TOVAPress"),
    "kvzip": PressSpec("KVzipPress"),
    "duo": PressSpec("DuoAttentionFolderPress", ratio=False),
}


def press_spec(name: str, written: str) -> PressSpec:
    """The :class:`PressSpec` of ``kvpress:NAME``; an unknown name refused in one line."""
    if name not in PRESSES:
        raise HeadprobeError(f"{param('spec', written)}: unknown kvpress press {name!r}; expected one of "
                             f"{', '.join(PRESSES)}")
    return PRESSES[name]


def _kvpress(written: str) -> Any:
    try:
        import kvpress  # patches transformers' attention functions on import
    except ImportError:
        raise HeadprobeError(f"{param('spec', written)}: kvpress settings need kvpress: pip install "
                             '"headprobe[kvpress]" (kvpress 0.5 needs transformers < 5.3: a separate environment)'
                             ) from None
    return kvpress


def _press_class(name: str, written: str) -> Any:
    if name == "DuoAttentionFolderPress":
        _kvpress(written)
        # kvpress (the optional `kvpress` extra), checked just above
        from .kvpress import DuoAttentionFolderPress

        return DuoAttentionFolderPress
    return getattr(_kvpress(written), name)


def _fields(cls: Any) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.init and f.name != "compression_ratio")


#: Options of a kvpress setting that are not the press's: ``compress_questions`` (kvpress's evaluation flag)
#: puts the question into the compressed context.
SETTING_OPTIONS = ("compress_questions",)


def make_press(name: str, options: Mapping[str, Any], ratio: float | None, written: str = "") -> Any:
    """The kvpress press of ``kvpress:NAME[options]`` at ``ratio`` (``None`` for ``none``); the setting's own
    options (:data:`SETTING_OPTIONS`) are checked and left out.

    Raises
    ------
    HeadprobeError
        kvpress missing, an unknown press, an option the press does not declare, or a value it refuses.
    """
    written = written or f"{KVPRESS}:{name}"
    spec = press_spec(name, written)
    for key in SETTING_OPTIONS:
        if key in options and not isinstance(options[key], bool):
            raise HeadprobeError(f"{param('spec', written)}: option {key}={options[key]!r}: expected true or false")
    options = {k: v for k, v in options.items() if k not in SETTING_OPTIONS}
    if spec.cls is None:
        if options:
            raise HeadprobeError(f"{param('spec', written)}: kvpress's pipeline without a press takes no options")
        _kvpress(written)
        return None
    cls = _press_class(spec.cls, written)
    inner_cls = _press_class(spec.inner, written) if spec.inner else None
    own, inner = {}, {}
    allowed = _fields(cls) + (_fields(inner_cls) if inner_cls else ())
    for key, value in options.items():
        if inner_cls is not None and key in _fields(inner_cls) and key not in _fields(cls):
            inner[key] = value
        elif key in _fields(cls) and key != "press":
            own[key] = value
        else:
            names = [k for k in allowed if k != "press"] + list(SETTING_OPTIONS)
            raise HeadprobeError(f"{param('spec', written)}: option {key!r} is not an option of kvpress's "
                                 f"{spec.cls} ({', '.join(names)})")
    ratio_arg = {"compression_ratio": ratio} if spec.ratio else {}
    try:
        if inner_cls is not None:
            return cls(press=inner_cls(**ratio_arg, **inner), **own)
        return cls(**ratio_arg, **own)
    except (AssertionError, TypeError, ValueError, OSError) as exc:
        raise HeadprobeError(f"{param('spec', written)}: kvpress's {spec.cls} refused the options: {exc}") from None


def check_press(name: str, options: Mapping[str, Any], written: str = "") -> None:
    """Build the press once (at a ratio of 0.5), so a missing kvpress or a bad option is refused before any
    model loads."""
    written = written or f"{KVPRESS}:{name}"
    spec = press_spec(name, written)
    make_press(name, options, 0.5 if spec.ratio else None, written)


def context_ratio(capacity: int, context_len: int, question_len: int) -> float:
    """kvpress's ``compression_ratio`` that keeps ``capacity - question_len`` of ``context_len`` context tokens.

    Raises
    ------
    HeadprobeError
        A capacity that leaves no context token (no larger than the question).
    """
    keep = min(capacity - question_len, context_len)
    if keep < 1:
        raise HeadprobeError(f"a capacity of {capacity} tokens per head leaves no context token beside a question of "
                             f"{question_len} tokens (kvpress keeps the question whole)")
    return 0.0 if keep >= context_len else 1.0 - (keep + 0.5) / context_len


@dataclass(frozen=True)
class PressRun:
    """One answer of a kvpress setting: what :class:`~headprobe.eval.setting_run.SettingRun` records, plus
    the per-prompt ratio and the tokens decoding attends."""

    text: str
    generated: list[int]
    cache_bytes: int
    full_cache_bytes: int
    seconds: float
    compression_ratio: float | None
    attended_tokens: float


_PIPELINES: dict[int, Any] = {}


def _pipeline(lm: LoadedModel) -> Any:
    """kvpress's pipeline over ``lm``'s model and tokenizer (one per loaded model)."""
    key = id(lm.model)
    if key not in _PIPELINES:
        _kvpress("kvpress")
        # transformers loads here: eval's setting parser imports this module and `headprobe --help` stays light
        from transformers import pipeline

        _PIPELINES.clear()
        _PIPELINES[key] = pipeline("kv-press-text-generation", model=lm.model, tokenizer=lm.tokenizer)
        presses_log = logging.getLogger("kvpress.presses.base_press")
        if not any(isinstance(f, _Once) for f in presses_log.filters):
            presses_log.addFilter(_Once())
    return _PIPELINES[key]


class _Once(logging.Filter):
    """Lets each of kvpress's press warnings through once a process: kvpress warns at every press it applies
    to a model outside its tested list (``Gemma3ForCausalLM``), a line for every prompt of a run."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.seen:
            return False
        self.seen.add(message)
        return True


def run_press(lm: LoadedModel, input_ids: list[int], context_len: int, name: str, options: Mapping[str, Any],
              capacity: int | None, max_new_tokens: int, written: str = "") -> PressRun:
    """Answer one prompt through kvpress's pipeline under ``kvpress:NAME[options]`` at ``capacity``.

    Parameters
    ----------
    input_ids
        ``[prompt_len]`` the prompt's token ids; the first ``context_len`` are kvpress's context.
    capacity
        Tokens per KV head the prompt keeps (:func:`context_ratio`); ``None`` for a press without a ratio.
    """
    import torch  # here, not above: eval's setting parser imports this module and `headprobe --help` stays light
    from transformers import DynamicCache

    written = written or f"{KVPRESS}:{name}"
    spec = press_spec(name, written)
    question_len = len(input_ids) - context_len
    if context_len < 1 or question_len < 1:
        raise HeadprobeError(f"{param('spec', written)}: the prompt splits into {context_len} context and "
                             f"{question_len} question tokens; kvpress needs both")
    ratio = context_ratio(capacity, context_len, question_len) if spec.ratio and capacity is not None else None
    press = make_press(name, options, ratio, written)
    if press is not None:
        pass_over_sliding_layers(press)
    pipe = _pipeline(lm)
    generated: list[int] = []
    hook = lm.model.register_forward_hook(
        lambda _m, _a, out: generated.append(int(out.logits[0, -1].argmax())))
    # the cache transformers builds for the model: a sliding-window layer (Gemma 3) keeps its window, as
    # headprobe's own cache does
    cache = DynamicCache(config=lm.model.config)
    start = time.perf_counter()
    try:
        text = pipe.forward({"context_ids": torch.tensor([input_ids[:context_len]]),
                             "questions_ids": [torch.tensor([input_ids[context_len:]])]},
                            max_new_tokens=max_new_tokens, press=press, cache=cache)[0]
    except (RuntimeError, AttributeError, AssertionError) as err:
        raise _press_failed(lm, written, err) from err
    finally:
        hook.remove()
    seconds = time.perf_counter() - start
    # kvpress's pipeline removes the question and the answer from the cache once answered: count them back
    after_context = question_len + max(len(generated) - 1, 0)
    held, per_token = 0, 0
    for layer in cache.layers:
        layer_bytes = layer.keys.nbytes + layer.values.nbytes
        per = layer_bytes // max(layer.keys.shape[-2], 1)
        per_token += per
        held += layer_bytes + (0 if getattr(layer, "is_sliding", False) else per * after_context)
    return PressRun(text=text, generated=generated, cache_bytes=int(held),
                    full_cache_bytes=int(per_token * (len(input_ids) + max(len(generated) - 1, 0))),
                    seconds=seconds, compression_ratio=None if ratio is None else round(ratio, 6),
                    attended_tokens=round(_attended_context(lm.model, cache) + question_len, 2))


def _press_failed(lm: LoadedModel, written: str, err: BaseException) -> HeadprobeError:
    """One line for a press kvpress's own code cannot run on this model (kvpress 0.5.5 on Gemma 3's text
    model: PyramidKVPress's layers of unequal length meet one attention mask, ExpectedAttentionPress looks
    for a rotary attribute Gemma 3 does not have); the trials logged before it stay for ``--resume``."""
    reason = (str(err).strip().splitlines() or [""])[0][:200]
    return HeadprobeError(f"{param('spec', written)}: kvpress {version('kvpress')}'s press fails on "
                          f"{type(lm.model).__name__} ({type(err).__name__}: {reason}); leave it out for this "
                          "model")


def pass_over_sliding_layers(press: Any) -> None:
    """Let ``press`` compress only the layers that attend every token, as kvpress does for Gemma 3.

    kvpress skips Gemma 3's sliding-window layers, but only in ``Gemma3ForConditionalGeneration``; in the
    text-only ``Gemma3ForCausalLM`` it would compress them too, and a sliding layer whose cache no longer
    holds its last tokens at their positions attends nothing useful (every answer is lost). Here kvpress's
    own hook runs unchanged on every other layer and returns a sliding layer's output untouched (a layer
    whose attention module says ``is_sliding``); a model without sliding layers runs as before.
    """
    compress_layer = press.forward_hook

    def forward_hook(module: Any, args: Any, kwargs: Any, output: Any) -> Any:
        if getattr(module, "is_sliding", False):
            return output
        return compress_layer(module, args, kwargs, output)

    press.forward_hook = forward_hook


def _attended_context(model: PreTrainedModel, cache: Any) -> float:
    """Mean over (layer, KV head) of the cached context tokens not masked by a head-wise press, over the
    layers that attend every token (a sliding-window layer attends its window under every setting, as in
    headprobe's own rows); the masks are cleared afterwards (kvpress would apply them to the next decode of
    this model)."""
    masked: dict[int, int] = {}
    for index, layer in enumerate(model.model.layers):
        found = getattr(layer.self_attn, "masked_key_indices", None)
        if found is not None:
            masked[index] = int(found[0].numel())
        layer.self_attn.masked_key_indices = None
    total, heads = 0, 0
    for index, layer in enumerate(cache.layers):
        if getattr(layer, "is_sliding", False):
            continue
        n_heads, tokens = layer.keys.shape[1], layer.keys.shape[-2]
        total += n_heads * tokens - masked.get(index, 0)
        heads += n_heads
    return total / heads if heads else 0.0
