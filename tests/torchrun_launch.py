"""Start ``torchrun --standalone --nproc-per-node N`` for the tests that compare a launch with one process.

The ranks talk over gloo's TCP transport on the loopback interface. On a loaded CI machine gloo can, rarely,
fail under a launch while neither rank has failed in headprobe's code: its TCP pair reports that the peer
reset the connection (``gloo/transport/tcp/pair.cc ... Connection reset by peer``), or a rank aborts in
gloo's C++ teardown (``terminate called without an active exception``). Such a launch is started again
once, from clean outputs, with a warning that quotes the error; any other failure, and a second one of
these, is returned as it is for the test to report.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

#: gloo's own message when a TCP pair between two ranks broke under it, and the C++ runtime's when a rank
#: aborted with a thread still running in its teardown.
GLOO_FAILURE = re.compile(r"gloo/transport/tcp/\w+\.cc:\d+\][^\n]*Connection (reset|closed) by peer"
                             r"|terminate called without an active exception")


def torchrun_command(args: Sequence[str], ranks: int = 2) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node RANKS ARGS`` (``ARGS`` starts with
    ``-m module`` or a script path)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), *args]


def gloo_failed(proc: subprocess.CompletedProcess) -> bool:
    """Whether a launch failed only in gloo's transport or teardown (see the module)."""
    return proc.returncode != 0 and GLOO_FAILURE.search(proc.stderr or "") is not None


def run_torchrun(args: Sequence[str], env: dict[str, str], fresh: Sequence[Path] = (), ranks: int = 2,
                 timeout: float = 600) -> subprocess.CompletedProcess:
    """Run a ``torchrun`` launch to its end; once more after a gloo transport failure (see the module).

    Parameters
    ----------
    args
        What follows ``--nproc-per-node N``: ``["-m", "headprobe", ...]`` or ``[script, ...]``.
    env
        The ranks' environment.
    fresh
        Files and folders the launch writes; removed before the second start, so that it begins where the
        first one did. Leave empty when the launch resumes from what it finds (``--resume``).
    """
    cmd = torchrun_command(args, ranks)
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
    if not gloo_failed(proc):
        return proc
    line = next(line for line in proc.stderr.splitlines() if GLOO_FAILURE.search(line))
    warnings.warn(f"torchrun launch started again after a gloo failure: {line.strip()[-200:]}",
                  stacklevel=2)
    for path in fresh:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
