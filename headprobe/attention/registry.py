"""Registering an attention implementation with transformers, once, at the point of use.

:func:`register_attention` and :func:`attention_switched` are the two steps; :class:`AttentionSwitch` is
the context manager built from them for implementations that read per-block state (which rows to record,
which heads to mask): it registers the implementation, switches the model to it, makes itself the active
state its attention function reads, and undoes all of that on exit.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def register_attention(name: str, forward: Callable, sdpa_masks: bool = True) -> None:
    """Register ``forward`` under ``name`` in transformers' ``AttentionInterface`` (idempotent).

    Parameters
    ----------
    name
        The implementation name for ``model.set_attn_implementation(name)``.
    forward
        ``forward(module, query, key, value, attention_mask, scaling=..., dropout=..., **kwargs)``.
    sdpa_masks
        Also register SDPA's mask builder under ``name``, so the model builds the masks SDPA expects.
    """
    # transformers loads here, on first use: importing this module costs torch only
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, sdpa_mask

    if AttentionInterface._global_mapping.get(name) is not forward:
        AttentionInterface.register(name, forward)
    if sdpa_masks and name not in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
        AttentionMaskInterface.register(name, sdpa_mask)


@contextlib.contextmanager
def attention_switched(model: PreTrainedModel, name: str) -> Iterator[Any]:
    """Switch ``model`` to the registered implementation ``name`` for the block, then restore the previous one."""
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        if previous:
            model.set_attn_implementation(previous)


class AttentionSwitch:
    """Base of context managers that run a model under their own attention implementation.

    A subclass names its implementation and gives its attention function as a class attribute::

        class RowRecorder(AttentionSwitch, implementation="headprobe_rows"):
            attention = staticmethod(_rows_attention)

    ``with RowRecorder(model) as rec:`` then registers ``_rows_attention`` under ``"headprobe_rows"``
    (SDPA's mask builder with it, unless ``sdpa_masks=False``), switches ``model`` to it, and makes
    ``rec`` the value of :meth:`active` until the block ends; on exit (also on an exception) the previous
    active value and the model's previous implementation come back. Nothing is patched at import time.
    Each subclass has its own active state (a :class:`contextvars.ContextVar`), so blocks of different
    subclasses nest, and so do blocks of the same one.

    Parameters
    ----------
    model
        A transformers model (``set_attn_implementation`` and ``config._attn_implementation``).
    """

    implementation: ClassVar[str]
    sdpa_masks: ClassVar[bool] = True
    #: ``attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs)``, with
    #: ``query [batch, query_heads, n, head_dim]`` and ``key``/``value [batch, kv_heads, keys, head_dim]``,
    #: returning ``(output [batch, n, query_heads, head_dim], weights or None)``.
    attention: ClassVar[Callable[..., Any]]
    _active: ClassVar[contextvars.ContextVar[Any]]

    def __init_subclass__(cls, *, implementation: str, sdpa_masks: bool = True, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.implementation = implementation
        cls.sdpa_masks = sdpa_masks
        cls._active = contextvars.ContextVar(implementation, default=None)

    def __init__(self, model: PreTrainedModel) -> None:
        self.model = model
        self._exit_stack: contextlib.ExitStack | None = None

    @classmethod
    def active(cls) -> Any:
        """The instance whose block is running in this context, ``None`` outside any."""
        return cls._active.get()

    def __enter__(self) -> Any:
        register_attention(self.implementation, type(self).attention, sdpa_masks=self.sdpa_masks)
        with contextlib.ExitStack() as stack:
            stack.enter_context(attention_switched(self.model, self.implementation))
            stack.callback(self._active.reset, self._active.set(self))
            self._exit_stack = stack.pop_all()
        return self

    def __exit__(self, *exc: object) -> None:
        stack, self._exit_stack = self._exit_stack, None
        if stack is not None:
            stack.__exit__(*exc)
