"""Where the kernel tests run: compiled on CUDA when there is a GPU, else in Triton's CPU interpreter.

Triton decorates its own ``tl.zeros``/``tl.sum``/``tl.max`` helpers when it is imported, reading
``TRITON_INTERPRET`` then; a process that imported Triton without it cannot interpret kernels that use
them. So ``TRITON_INTERPRET=1`` is never set in this process: the tests that need the interpreter (they
ask for the ``interpreter`` fixture, or for ``kernel_device`` on a machine without CUDA) run together in
one child pytest process started with the variable, and each reports the child's outcome here. A run
started with ``TRITON_INTERPRET=1`` runs them in process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from headprobe.runtime.kernels.launch import interpreter_loaded

_RESULTS_ENV = "HEADPROBE_INTERPRETED_RESULTS"
_CHILD_TIMEOUT_S = 900


def _needs_interpreter(item) -> bool:
    names = getattr(item, "fixturenames", ())
    return "interpreter" in names or ("kernel_device" in names and not torch.cuda.is_available())


@pytest.fixture
def interpreter():
    """This test runs in Triton's CPU interpreter (in the child process, see the module docstring)."""
    pytest.importorskip("triton")


@pytest.fixture
def kernel_device() -> torch.device:
    """``cuda`` (compiled kernels) when a GPU is present, else ``cpu`` under the interpreter."""
    pytest.importorskip("triton")
    if torch.cuda.is_available() and not interpreter_loaded():
        return torch.device("cuda")
    return torch.device("cpu")


@pytest.fixture
def fresh_dispatch():
    """Backend ``auto`` and a fresh process's launch state before and after the test."""
    from headprobe.runtime.kernels import dispatch

    previous = dispatch.set_kernel_backend("auto")
    dispatch.reset_launch_state()
    yield dispatch
    dispatch.set_kernel_backend(previous)
    dispatch.reset_launch_state()


def _run_child(session) -> dict[str, dict]:
    """Run every collected test that needs the interpreter in one child process; outcomes by node id."""
    ids = [item.nodeid for item in session.items if _needs_interpreter(item)]
    with tempfile.TemporaryDirectory() as tmp:
        results = Path(tmp) / "results.jsonl"
        env = {**os.environ, "TRITON_INTERPRET": "1", _RESULTS_ENV: str(results)}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *ids]
        proc = subprocess.run(cmd, check=False, cwd=session.config.rootpath, env=env, capture_output=True,
                              text=True, timeout=_CHILD_TIMEOUT_S)
        found = {}
        if results.exists():
            for line in results.read_text().splitlines():
                record = json.loads(line)
                found[record["nodeid"]] = record
    if not found:
        found["<child>"] = {"outcome": "failed", "text": (proc.stdout + proc.stderr)[-4000:]}
    return found


def pytest_pyfunc_call(pyfuncitem):
    """Report the child's outcome for interpreted tests when this process cannot interpret."""
    if not _needs_interpreter(pyfuncitem) or interpreter_loaded():
        return None
    session = pyfuncitem.session
    if not hasattr(session, "_interpreted_results"):
        session._interpreted_results = _run_child(session)
    results = session._interpreted_results
    record = results.get(pyfuncitem.nodeid) or results.get("<child>") or {
        "outcome": "failed", "text": "the interpreter child process did not run this test"}
    if record["outcome"] == "skipped":
        pytest.skip(record["text"])
    if record["outcome"] != "passed":
        pytest.fail(f"in the TRITON_INTERPRET=1 child process:\n{record['text']}", pytrace=False)
    return True


def pytest_runtest_logreport(report):
    """In the child: append each interpreted test's outcome for the parent to read."""
    path = os.environ.get(_RESULTS_ENV)
    if not path or not (report.when == "call" or report.outcome != "passed"):
        return
    if report.when == "teardown" and report.outcome == "passed":
        return
    text = report.longreprtext if report.outcome == "failed" else ""
    if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
        text = report.longrepr[2]
    with open(path, "a") as fh:
        fh.write(json.dumps({"nodeid": report.nodeid, "outcome": report.outcome, "text": text}) + "\n")


@pytest.fixture
def guard_events(monkeypatch):
    """``(events, record)``: ``record(module, kernels)`` replaces ``module.device_guard`` with one that logs
    ``("enter", device)`` and ``"exit"``, and each ``kernel.launch`` in ``kernels`` (name -> kernel) with one
    that logs its name, into ``events``."""
    events: list = []

    class Guard:
        def __init__(self, device):
            self.device = device

        def __enter__(self):
            events.append(("enter", self.device))

        def __exit__(self, *exc):
            events.append("exit")

    def record(module, kernels: dict) -> None:
        monkeypatch.setattr(module, "device_guard", Guard)
        for name, kernel in kernels.items():
            launch = kernel.launch
            monkeypatch.setattr(kernel, "launch",
                                lambda *a, _launch=launch, _name=name, **k: (events.append(_name), _launch(*a, **k)))

    return events, record
