"""The first load of a packaged GGUF converts it once and says so in one line: no conversion or shard bars."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_the_first_load_prints_one_line_and_no_progress_bar(tmp_path):
    env = {**os.environ, "HEADPROBE_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    code = "import headprobe as hp; print(hp.load_model('smollm2-135m', device='cpu').identity.num_layers)"
    first = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code], check=False, env=env,
                           capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == "30"
    lines = first.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("converting HuggingFaceTB/SmolLM2-135M-Instruct"), lines
    assert "\r" not in first.stderr and "it/s" not in first.stderr
    again = subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0 and again.stderr == ""                 # converted once
