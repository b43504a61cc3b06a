"""The README's Python example runs as written (in a scratch folder) and does what it says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _python_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert len(blocks) == 1, "the README holds one Python example"
    return blocks[0]


@pytest.mark.slow
def test_readme_python_example_runs(tmp_path, monkeypatch, capsys, one_thread):
    monkeypatch.chdir(tmp_path)
    exec(compile(_python_block(), "README.md", "exec"), {})     # noqa: S102 (the README's own example)
    folder = tmp_path / "my-profiles"
    assert len(list(folder.glob("*.retrieval_reasoning.json"))) == 1
    assert len(list(folder.glob("*.trials.jsonl"))) == 1
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    answer, used, full = re.fullmatch(r"(.*) ([\d,]+) of ([\d,]+) cache bytes", printed).groups()
    assert "4817" in answer                                   # the answer still comes out
    assert int(used.replace(",", "")) < int(full.replace(",", ""))   # from a cache smaller than the full one
