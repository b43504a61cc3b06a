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


def tqdm_steps(total: int, description: str, unit: str):
    """A ``step(label)`` callable backed by a tqdm bar of ``total`` steps: each call ends the step before and
    shows ``label`` as the one running; ``step(None)`` ends the last and closes the bar."""
    bar = tqdm(total=total, desc=description, unit=unit, dynamic_ncols=True)
    running = False

    def step(label: str | None) -> None:
        nonlocal running
        if running:
            bar.update(1)
        running = label is not None
        if running:
            bar.set_postfix_str(label)
        else:
            bar.close()

    return step
