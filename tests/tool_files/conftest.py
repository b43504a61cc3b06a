"""Fixtures of the tool-file tests that read Gemma 3's own GGUF."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest

from headprobe.errors import HeadprobeError
from headprobe.models.loading import _gguf_path
from headprobe.models.registry import MODELS


@pytest.fixture(scope="module")
def gemma3_gguf() -> Path:
    """The GGUF Gemma 3's model package ships; skipped where the package is not installed (as the real-model
    tests are)."""
    try:
        return _gguf_path(MODELS["gemma3-270m"])
    except HeadprobeError as exc:
        pytest.skip(str(exc))


def gguf_with_metadata(source: Path, copy: Path, metadata: dict[str, int]) -> Path:
    """``source`` copied to ``copy`` with ``metadata`` written into it by llama.cpp's own in-place editor
    (gguf-py's ``gguf_set_metadata``); skipped without gguf-py."""
    gguf = pytest.importorskip("gguf")
    set_metadata = pytest.importorskip("gguf.scripts.gguf_set_metadata").set_metadata
    shutil.copyfile(source, copy)
    writer = gguf.GGUFReader(copy, "r+")
    for key, value in metadata.items():
        set_metadata(writer, argparse.Namespace(key=key, value=str(value), dry_run=False, force=True))
    del writer                                         # the memory map writes through
    return copy
