"""Progress bars for long commands (tqdm on stderr)."""

from __future__ import annotations

from tqdm.auto import tqdm


def tqdm_progress(total: int, description: str):
    """A ``progress(n)`` callable backed by a tqdm bar of ``total`` steps."""
    bar = tqdm(total=total, desc=description, unit="trial", dynamic_ncols=True)

    def advance(n: int) -> None:
        bar.update(n)
        if bar.n >= bar.total:
            bar.close()

    if total == 0:
        bar.close()
    return advance
