"""Merge ``headprobe eval`` results that ran the same grid with different needles into one result.

Usage::

    python benchmarks/merge_eval_results.py part_r01.json part_r02.json -o eval.json [--force]

A long grid can run as one process per needle (``--needle-ids r01`` and ``--needle-ids r02``, each with
its own ``--out``), side by side on separate cores; this joins their cells. The parts must share the
model, the settings (labels and options), the grid and the haystack, and hold different needles; each
merged cell holds the trials of every part, with accuracy, bytes and ms per token recomputed over them
(:func:`headprobe.eval.cell_log.cell_record`). The merged result is complete when every part is.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from headprobe import HeadprobeError
from headprobe.eval.cell_log import cell_record
from headprobe.eval.result import EvalResult
from headprobe.eval.settings import EvalSetting
from headprobe.frontend import check_overwrite


def _same(parts: list[EvalResult], what: str, get) -> None:
    first = get(parts[0])
    for p in parts[1:]:
        if get(p) != first:
            raise HeadprobeError(f"the parts differ in their {what}; only runs of one grid can be merged")


def merge(parts: list[EvalResult]) -> EvalResult:
    """One result with the cells of every part joined trial by trial.

    Raises
    ------
    HeadprobeError
        Parts of another model, settings, grid or haystack, or parts that share a needle.
    """
    if len(parts) < 2:
        raise HeadprobeError("give at least two results to merge")
    _same(parts, "model", lambda r: r.model.get("fingerprint"))
    _same(parts, "settings", lambda r: [(s["label"], s.get("options")) for s in r.settings])
    _same(parts, "grid", lambda r: r.grid)
    _same(parts, "task kind or haystack", lambda r: (r.task.get("kind"), r.task.get("haystack_fingerprint")))
    ids = [i for r in parts for i in r.task.get("needle_ids", [])]
    if len(ids) != len(set(ids)):
        raise HeadprobeError(f"the parts share needles ({', '.join(sorted({i for i in ids if ids.count(i) > 1}))})")
    settings = {s["label"]: EvalSetting(s["name"], s["policy"], s["allocation"], tuple(s["profiles"]),
                                        s["capacity"], dict(s["options"])) for s in parts[0].settings}
    trials: dict[str, list[dict]] = {}
    where: dict[str, tuple[str, int, float | None]] = {}
    for r in parts:
        for c in r.cells:
            trials.setdefault(c["trial"], []).extend(c["trials"])
            where[c["trial"]] = (c["setting"], c["length"], c["depth"])
    cells = [cell_record(settings[label], length, depth, trials[key]) for key, (label, length, depth) in where.items()]
    task = {**parts[0].task, "needle_ids": ids}
    return EvalResult(parts[0].model, task, parts[0].grid, parts[0].settings, cells,
                      complete=all(r.complete for r in parts), created=parts[0].created,
                      headprobe_version=parts[0].headprobe_version,
                      extra={"merged_from": [r.task.get("needle_ids") for r in parts]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="+", help="headprobe.eval result JSONs of one grid, different needles")
    ap.add_argument("-o", "--out", required=True, help="merged result JSON")
    ap.add_argument("--force", action="store_true", help="replace an existing --out")
    args = ap.parse_args()
    out = Path(args.out)
    check_overwrite(out, args.force)
    merged = merge([EvalResult.load(p) for p in args.parts])
    merged.save(out, force=args.force)
    print(f"wrote {out}: {len(merged.cells)} cells from {len(args.parts)} parts")


if __name__ == "__main__":
    main()
