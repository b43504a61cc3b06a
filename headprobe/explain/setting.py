"""What an explanation is computed for: the context length, the batch, the cache dtype and the decoding.

Every number ``headprobe explain`` reports is for one :class:`Setting`; its checks run before any file
is read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import HeadprobeError, param
from ..limits import check_count

#: Bytes of one cached element in each dtype a KV cache is commonly held in.
DTYPE_BYTES: dict[str, int] = {"float32": 4, "bfloat16": 2, "float16": 2}

#: Tokens generated when none is said (``headprobe generate``'s default).
DEFAULT_NEW_TOKENS = 64


@dataclass(frozen=True)
class Setting:
    """One context length, batch, dtype and decoding length.

    Attributes
    ----------
    context
        ``N``: prompt tokens each sequence of the batch holds when prefill ends.
    batch
        Sequences processed together (every engine's bytes are for the whole batch).
    dtype
        Element type of the cached keys and values (a key of :data:`DTYPE_BYTES`).
    max_new_tokens
        ``M``: tokens generated after the prompt. The cache stores ``M - 1`` of them (the last generated
        token is never fed back), so a full cache ends at ``N + M - 1`` tokens a head.
    """

    context: int
    batch: int = 1
    dtype: str = "bfloat16"
    max_new_tokens: int = DEFAULT_NEW_TOKENS

    def __post_init__(self) -> None:
        check_count("context", self.context)
        check_count("batch", self.batch, unit="sequences")
        check_count("max_new_tokens", self.max_new_tokens)
        if self.dtype not in DTYPE_BYTES:
            raise HeadprobeError(f"{param('dtype', self.dtype)}: expected one of {', '.join(DTYPE_BYTES)}")

    @property
    def element_bytes(self) -> int:
        """Bytes of one cached element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def appended(self) -> int:
        """Tokens decoding appends to every head of a cache: ``M - 1``."""
        return self.max_new_tokens - 1

    def token_bytes(self, head_dim: int) -> int:
        """Bytes of one cached token of one head: its key and its value, ``2 · head_dim`` elements."""
        return 2 * head_dim * self.element_bytes


def format_bytes(n: float) -> str:
    """``n`` bytes in binary units: ``"1.50 MiB"`` (whole bytes below 1 KiB)."""
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}"
    raise AssertionError("unreachable")


__all__ = ("DEFAULT_NEW_TOKENS", "DTYPE_BYTES", "Setting", "format_bytes")
