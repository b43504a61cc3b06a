"""The eval result file (``format: "headprobe.eval"``, ``version: 1``): settings, cells, summary."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FileFormatError
from ..files.jsonio import atomic_write_json, read_headprobe_file, require

EVAL_FORMAT = "headprobe.eval"
EVAL_VERSION = 1
#: A trial "finds" the needle when its score is above this (the published success gate).
PASS_THRESHOLD = 0.5


@dataclass
class EvalResult:
    """A finished (or partial) eval grid.

    Attributes
    ----------
    model
        Model identity JSON.
    task
        What was asked: kind (``needle``, ``babi``, ``dataset``), needle file / dataset, fingerprints.
    grid
        ``{"lengths": [...], "depths": [...]}`` (depths ``[null]`` for datasets).
    settings
        :meth:`EvalSetting.to_json` of every setting, in run order.
    cells
        One record per finished (setting, length, depth) cell: ``accuracy`` (mean score), ``n``,
        ``cache_bytes`` (allocated by the cache, mean over trials), ``used_bytes`` (pairs held),
        ``full_cache_bytes``, ``ms_per_token`` and the ``trials``.
    complete
        Every cell of the grid is done.
    """

    model: dict[str, Any]
    task: dict[str, Any]
    grid: dict[str, Any]
    settings: list[dict[str, Any]]
    cells: list[dict[str, Any]]
    complete: bool = False
    created: str = ""
    headprobe_version: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> list[dict[str, Any]]:
        """Per setting: mean accuracy over its cells, mean cache bytes, ms per token, cells done."""
        out = []
        for s in self.settings:
            cells = [c for c in self.cells if c["setting"] == s["label"]]
            if not cells:
                out.append({"setting": s["label"], "cells": 0})
                continue
            trials = [t for c in cells for t in c["trials"]]
            tokens = sum(t["new_tokens"] for t in trials)
            out.append({
                "setting": s["label"], "name": s["name"], "capacity": s["capacity"], "cells": len(cells),
                "mean_accuracy": float(np.mean([c["accuracy"] for c in cells])),
                "pass_rate": float(np.mean([t["score"] > PASS_THRESHOLD for t in trials])),
                "cache_bytes": float(np.mean([t["cache_bytes"] for t in trials])),
                "used_bytes": float(np.mean([t["used_bytes"] for t in trials])),
                "full_cache_bytes": float(np.mean([t["full_cache_bytes"] for t in trials])),
                "ms_per_token": 1000.0 * sum(t["seconds"] for t in trials) / max(tokens, 1),
            })
            if all("needle_recall" in t for t in trials):     # long generation: is the needle in the report
                out[-1]["needle_recall"] = float(np.mean([t["needle_recall"] for t in trials]))
        return out

    def accuracy_grid(self, label: str) -> np.ndarray:
        """``[depths, lengths]`` accuracy of one setting (NaN where a cell is not done)."""
        lengths, depths = self.grid["lengths"], self.grid["depths"]
        grid = np.full((len(depths), len(lengths)), np.nan)
        for c in self.cells:
            if c["setting"] == label:
                grid[depths.index(c["depth"]), lengths.index(c["length"])] = c["accuracy"]
        return grid

    def to_json(self) -> dict[str, Any]:
        return {"format": EVAL_FORMAT, "version": EVAL_VERSION, "created": self.created,
                "headprobe_version": self.headprobe_version, "model": self.model, "task": self.task,
                "grid": self.grid, "settings": self.settings, "complete": self.complete,
                "summary": self.summary(), "cells": self.cells, **self.extra}

    def save(self, path: str | Path, force: bool = False) -> Path:
        """Write the result whole; an existing file is replaced only with ``force`` (checked as it is put in
        place, so a result another run wrote meanwhile is refused, not replaced)."""
        return atomic_write_json(path, self.to_json(), overwrite=force)

    @classmethod
    def load(cls, path: str | Path) -> EvalResult:
        """Read and validate an eval result file (one-line errors naming the field)."""
        obj = read_headprobe_file(path, EVAL_FORMAT, EVAL_VERSION)
        for key, kind in (("model", dict), ("task", dict), ("grid", dict), ("settings", list), ("cells", list)):
            require(obj, key, kind, path)
        labels = set()
        for i, s in enumerate(obj["settings"]):
            if not isinstance(s, dict):
                raise FileFormatError(path, f"settings[{i}]", "expected an object")
            labels.add(require(s, "label", str, path, f"settings[{i}]."))
        for i, c in enumerate(obj["cells"]):
            if not isinstance(c, dict):
                raise FileFormatError(path, f"cells[{i}]", "expected an object")
            if require(c, "setting", str, path, f"cells[{i}].") not in labels:
                raise FileFormatError(path, f"cells[{i}].setting", f"{c['setting']!r} is not one of the settings")
            require(c, "accuracy", (int, float), path, f"cells[{i}].")
            require(c, "trials", list, path, f"cells[{i}].")
        known = {"format", "version", "created", "headprobe_version", "model", "task", "grid", "settings",
                 "complete", "summary", "cells"}
        return cls(obj["model"], obj["task"], obj["grid"], obj["settings"], obj["cells"],
                   bool(obj.get("complete")), obj.get("created", ""), obj.get("headprobe_version", ""),
                   {k: v for k, v in obj.items() if k not in known})


def format_eval_summary(result: EvalResult) -> str:
    """A short text table: setting, accuracy, share of trials found (score > 0.5), cache MiB, share of the full cache, ms/token."""
    rows = [f"{'setting':<24} {'acc':>6} {'found':>6} {'cache MiB':>10} {'of full':>8} {'ms/tok':>8} {'cells':>6}"]
    for s in result.summary():
        if not s["cells"]:
            rows.append(f"{s['setting']:<24} {'-':>6}")
            continue
        share = s["cache_bytes"] / max(s["full_cache_bytes"], 1)
        rows.append(f"{s['setting']:<24} {s['mean_accuracy']:>6.3f} {s['pass_rate']:>6.2f} "
                    f"{s['cache_bytes'] / 2**20:>10.2f} "
                    f"{share:>8.1%} {s['ms_per_token']:>8.1f} {s['cells']:>6}")
    return "\n".join(rows)
