"""The tests' torchrun launcher starts a launch again only when gloo's transport or teardown failed under it."""

from __future__ import annotations

import os
import textwrap

import pytest
from torchrun_launch import gloo_failed, run_torchrun

#: What a rank prints when its TCP pair to another rank breaks (torch 2.13, gloo).
GLOO_RESET = ("[rank1]: RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] "
              "Read error [127.0.0.1]:2457: Connection reset by peer. This is typically caused by a remote worker")


def _script(tmp_path, message: str):
    """A rank that fails with ``message`` on its first start and succeeds after; it counts its starts."""
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(f"""
        import pathlib, sys
        starts = pathlib.Path({str(tmp_path / "starts")!r})
        starts.write_text(starts.read_text() + "x" if starts.exists() else "x")
        out = pathlib.Path({str(tmp_path / "out")!r})
        if out.exists():
            sys.exit("out was not cleared")
        if len(starts.read_text()) == 1:
            out.mkdir()
            sys.exit({message!r})
    """))
    return script


def test_a_gloo_transport_failure_is_started_again_from_clean_outputs(tmp_path):
    with pytest.warns(UserWarning, match="started again after a gloo failure"):
        proc = run_torchrun([str(_script(tmp_path, GLOO_RESET))], dict(os.environ), fresh=[tmp_path / "out"],
                            ranks=1)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "starts").read_text() == "xx"


def test_an_abort_in_gloos_teardown_is_started_again(tmp_path):
    with pytest.warns(UserWarning, match="terminate called without an active exception"):
        proc = run_torchrun([str(_script(tmp_path, "terminate called without an active exception"))],
                            dict(os.environ), fresh=[tmp_path / "out"], ranks=1)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "starts").read_text() == "xx"


def test_any_other_failure_is_returned_as_it_is(tmp_path):
    proc = run_torchrun([str(_script(tmp_path, "headprobe: error: --lengths: expected integers"))],
                        dict(os.environ), fresh=[tmp_path / "out"], ranks=1)
    assert proc.returncode != 0 and "expected integers" in proc.stderr
    assert (tmp_path / "starts").read_text() == "x" and not gloo_failed(proc)
