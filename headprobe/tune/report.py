"""The tune report (``format: "headprobe.tune"``, ``version: 1``), the chosen budget maps and setting strings.

Per capacity the report holds every candidate (its stages, the rung where it was dropped and why, its
calibration trials, accuracy with a bootstrap interval, cache bytes), the races rung by rung, the chosen
setting (its label, the budget map written for it and the setting string that runs that map), and the
held-out eval: the chosen setting, every preset and the full cache on the held-out items, each with its
interval and the paired interval of the chosen setting's lead over it. ``docs/tune.md`` lists the fields.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import __version__
from ..allocation.api import allocate
from ..allocation.options import format_option_value
from ..budget_map import BudgetMap
from ..errors import HeadprobeError, param
from ..eval.presets import PUBLISHED, QUESTION_WINDOW
from ..eval.runner import resolve_budget
from ..eval.settings import EvalSetting
from ..files.jsonio import atomic_write_json, check_writable_dir, read_headprobe_file
from ..files.overwrite import check_overwrite
from ..runtime.policies import POLICIES
from .halving import bootstrap_means, interval, mean_interval
from .runner import TuneOutcome
from .space import searched_policy_options
from .takeover import staging_dir
from .trial_runs import runs_dir

if TYPE_CHECKING:
    from ..models.loading import LoadedModel

TUNE_FORMAT = "headprobe.tune"
TUNE_VERSION = 1


def map_path(out: str | Path, capacity: int) -> Path:
    """``<dir>/<stem>.c<capacity>.budget.json``: the chosen setting's budget map at one capacity."""
    out = Path(out)
    return out.with_name(f"{out.stem}.c{capacity}.budget.json")


def figure_path(out: str | Path) -> Path:
    """``<dir>/<stem>.png``: the report's figure by default."""
    return Path(out).with_suffix(".png")


def output_files(out: str | Path, capacities: Sequence[int], figure: str | Path | None) -> list[Path]:
    """Every file the report step writes: the report, the budget maps and the figure."""
    files = [Path(out), *(map_path(out, c) for c in capacities)]
    return files + ([Path(figure)] if figure is not None else [])


def check_tune_outputs(out: str | Path, capacities: Sequence[int], figure: str | Path | None, resume: bool,
                       force: bool) -> None:
    """Refuse, before the model loads, a run that would replace what an earlier run left.

    The run folder (:func:`~headprobe.tune.trial_runs.runs_dir`) needs ``resume`` or ``force`` when it holds
    runs. An existing report, budget map or figure needs ``force``, except that with ``resume`` the files
    an existing tune report at ``out`` lists (it made them) are rewritten.

    Raises
    ------
    HeadprobeError
        Naming the file and the flag that allows it.
    """
    out = Path(out)
    check_writable_dir(out.parent if str(out.parent) else Path("."))
    for cap in capacities:            # the setting string names the map: the settings grammar must carry its path
        if any(ch in str(map_path(out, cap)) for ch in "[],@:"):
            raise HeadprobeError(f"{param('out', str(out))}: the budget map {map_path(out, cap)} could not be named in "
                                 "a setting (its path holds [ ] , @ or :); write the report elsewhere")
    folder = runs_dir(out)
    if folder.is_dir() and any(folder.iterdir()) and not (resume or force):
        raise HeadprobeError(f"{folder}: a tune run's eval logs are there; pass {param('resume', True)} to continue "
                             f"it or {param('force', True)} to start over")
    staging = staging_dir(folder)
    if staging.is_dir() and any(staging.iterdir()) and not (resume or force):
        raise HeadprobeError(f"{staging}: the eval logs of a forced tune run that has not replaced {folder.name} yet "
                             f"are there; pass {param('resume', True)} to continue it or {param('force', True)} to "
                             "start over")
    if force:
        return
    mine: set[Path] = set()
    if resume and out.is_file():
        try:
            listed = read_headprobe_file(out, TUNE_FORMAT, TUNE_VERSION).get("files") or {}
            mine = {(out.parent / f).resolve() for f in listed.values() if isinstance(f, str)} | {out.resolve()}
        except HeadprobeError:
            mine = set()
    for path in output_files(out, capacities, figure):
        if path.resolve() not in mine:
            check_overwrite(path, False, hint="or write elsewhere")


def _mean(values: Sequence[float]) -> float:
    return float(np.mean(values)) if len(values) else float("nan")


def _trial_json(key: tuple, t: dict[str, Any]) -> dict[str, Any]:
    return {"item": key[0], "length": key[1], "depth": key[2], "score": t["score"],
            "cache_bytes": t["cache_bytes"]}


def _candidate_block(outcome: TuneOutcome, cap_index: int, calibration: set[str]) -> list[dict[str, Any]]:
    rule, store = outcome.request.rule, outcome.store
    entries: dict[str, dict[str, Any]] = {}
    for stage, races in (("selection", outcome.stage1), ("allocation", outcome.stage2)):
        race = races[cap_index]
        for c in race.candidates:
            e = entries.setdefault(c.label, {"label": c.label, "setting": c.to_json(), "stages": {}})
            rungs = [(r["rung"], st) for r in race.rungs for st in r["standings"] if st.label == c.label]
            last_rung, last = rungs[-1]
            final = last_rung == len(race.rungs) - 1
            e["stages"][stage] = {"origin": race.origin.get(c.label, "generated"), "rungs_run": len(rungs),
                                  "dropped_at_rung": None if final else last_rung,
                                  "reason": "" if final else last.reason,
                                  "final_rank": last.rank if final else None}
        for label, why in race.skipped.items():
            entries.setdefault(label, {"label": label, "setting": race.skipped_settings[label].to_json(), "stages": {}})
            entries[label]["stages"][stage] = {"origin": "generated", "skipped": why}
    chosen = outcome.chosen[outcome.stage2[cap_index].capacity].label
    out = []
    for label, e in entries.items():
        trials = [(k, t) for k, t in store.of(label) if k[0] in calibration]
        scores = [float(t["score"]) for _, t in trials]
        e["status"] = "chosen" if label == chosen else "skipped" if all("skipped" in s for s in e["stages"].values()) \
            else "finalist" if any(s.get("final_rank") for s in e["stages"].values()) else "dropped"
        e["trials"] = [_trial_json(k, t) for k, t in trials]
        e["n"] = len(scores)
        e["accuracy"] = round(_mean(scores), 6) if scores else None
        e["interval"] = [round(x, 6) for x in mean_interval(scores, rule)] if scores else None
        e["cache_bytes"] = round(_mean([t["cache_bytes"] for _, t in trials]), 1) if trials else None
        e["used_bytes"] = round(_mean([t["used_bytes"] for _, t in trials]), 1) if trials else None
        out.append(e)
    return out


def _holdout_block(outcome: TuneOutcome, capacity: int) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Every held-out setting of this capacity (and the full cache), with the chosen one's paired lead."""
    rule, store, task = outcome.request.rule, outcome.store, outcome.request.task
    keys = task.trial_keys(list(outcome.request.split.holdout))
    chosen = outcome.held_as.get(capacity, outcome.chosen[capacity].label)
    rows, best = [], None
    # a budget-map file (a layer split a user would deploy) has its own capacity: it is shown at every one
    mine = [s for s in outcome.holdout_settings if s.capacity in (capacity, None) or s.allocation == "map"]
    labels = [s.label for s in mine if store.has(s.label, keys)]
    if chosen not in labels or not keys:
        return [], None
    scores = np.array([store.scores(lab, keys) for lab in labels])
    boot = bootstrap_means(scores, rule)
    ci = labels.index(chosen)
    for i, s in enumerate([s for s in mine if s.label in labels]):
        preset = s.name if s.name in PUBLISHED else None
        kind = "chosen" if s.label == chosen else "full" if s.policy == "full" \
            else "preset" if preset is not None else "setting"
        row = {"label": s.label, "kind": kind, "preset": preset, "published": preset is not None,
               "chosen": s.label == chosen, "n": len(keys), "accuracy": round(float(scores[i].mean()), 6),
               "interval": [round(x, 6) for x in interval(boot[:, i], rule.level)],
               "cache_bytes": round(store.mean_bytes(s.label), 1)}
        if s.label != chosen:
            row["chosen_minus_this"] = [round(x, 6) for x in interval(boot[:, ci] - boot[:, i], rule.level)]
        rows.append(row)
    presets = [r for r in rows if r["preset"] is not None and r["kind"] != "full"]     # the chosen one may be one
    if presets:
        top = max(presets, key=lambda r: (r["accuracy"], -r["cache_bytes"], r["chosen"]))
        lead = top.get("chosen_minus_this", [0.0, 0.0])
        verdict = ("the chosen setting is this preset" if top["chosen"] else "chosen better" if lead[0] > 0
                   else "chosen worse" if lead[1] < 0 else "no real difference")
        best = {"label": top["label"], "accuracy": top["accuracy"], "interval": top["interval"],
                "chosen_minus_best": lead, "verdict": verdict}
    return rows, best


def chosen_window(setting: EvalSetting, windows: dict[str, int]) -> int:
    """The window the chosen setting's budget map is allocated for: its own, or for a question window the
    longest question window of the task's items (every prompt's window then fits)."""
    window = setting.window()
    if window == QUESTION_WINDOW:
        if not windows:
            raise HeadprobeError(f"setting {setting.label}: a question window needs the items' prompts")
        return max(windows.values())
    return int(window)


def chosen_map(lm: LoadedModel, setting: EvalSetting, window: int, profile_dirs: list[Path] | None,
               report: str | Path) -> Any:
    """The chosen setting's budget map, allocated for ``window``, recording how it runs
    (``method.run_with``) and where it came from (``method.tune``)."""
    budget = resolve_budget(lm, setting, profile_dirs, window)
    bm = budget if isinstance(budget, BudgetMap) else allocate("uniform", [], lm.identity,
                                                                capacity=int(setting.capacity), window=window)
    options = {**setting.options, "window": window}
    method = {**bm.method, "run_with": {"policy": setting.policy, "options": options},
              "tune": {"label": setting.label, "report": Path(report).name,
                       "window": setting.options.get("window", window)}}
    return BudgetMap(bm.model, method, bm.shares, bm.budgets, bm.granularity)


def map_setting_string(setting: EvalSetting, path: str | Path) -> str:
    """``POLICY:MAP.json[OPTIONS]``: the setting that runs the chosen map, every searched policy option named
    (a question window stays ``window=question``).

    Raises
    ------
    HeadprobeError
        A path the settings grammar cannot carry (``[``, ``]``, ``,``, ``@`` or ``:`` in it), or a string
        that does not read back to the chosen setting's policy and options.
    """
    text = str(path)
    if any(ch in text for ch in "[],@:"):
        raise HeadprobeError(f"{text}: a setting cannot name a file whose path holds [ ] , @ or :; write the report "
                             "elsewhere")
    defaults = _filled(EvalSetting(setting.name, setting.policy))
    options = {**{k: defaults[k] for k in searched_policy_options(setting.policy)}, **setting.options}
    inner = ",".join(f"{k}={format_option_value(v)}" for k, v in options.items())
    return f"{setting.policy}:{text}[{inner}]" if inner else f"{setting.policy}:{text}"


def _filled(setting: EvalSetting) -> dict[str, Any]:
    """A setting's policy options with the policy's defaults filled in."""
    return {**{f.name: f.default for f in fields(POLICIES[setting.policy])}, **setting.options}


def build_report(outcome: TuneOutcome, lm: LoadedModel, files: dict[str, str], strings: dict[int, str],
                 resumed: bool) -> dict[str, Any]:
    """The report's JSON (see the module docstring)."""
    req = outcome.request
    calibration = set(req.split.calibration)
    capacities = []
    for k, cap in enumerate(req.capacities):
        chosen = outcome.chosen[cap]
        cal_scores = [float(t["score"]) for key, t in outcome.store.of(chosen.label) if key[0] in calibration]
        holdout, best = _holdout_block(outcome, cap)
        mine = next((r for r in holdout if r["chosen"]), None)
        capacities.append({
            "capacity": cap,
            "chosen": {"label": chosen.label, "held_out_as": outcome.held_as.get(cap, chosen.label),
                       "setting": chosen.to_json(), "setting_string": strings.get(cap),
                       "budget_map": files.get(f"budget_map_{cap}"),
                       "calibration": {"n": len(cal_scores), "accuracy": round(_mean(cal_scores), 6),
                                       "interval": [round(x, 6) for x in mean_interval(cal_scores, req.rule)]},
                       "holdout": None if mine is None else {k2: mine[k2] for k2 in ("n", "accuracy", "interval",
                                                                                     "cache_bytes")}},
            "best_preset_holdout": best,
            "holdout": holdout,
            "stages": [{"stage": stage, "rungs": [
                {"rung": r["rung"], "items": r["items"], "trials": r["trials"], "candidates": len(r["standings"]),
                 "kept": sum(st.kept for st in r["standings"]), "standings": [st.to_json() for st in r["standings"]]}
                for r in races[k].rungs]} for stage, races in (("selection", outcome.stage1),
                                                              ("allocation", outcome.stage2))],
            "candidates": _candidate_block(outcome, k, calibration),
        })
    search = [r for r in outcome.runs if r.stage != "holdout"]
    held = [r for r in outcome.runs if r.stage == "holdout"]
    task = req.task
    return {
        "format": TUNE_FORMAT, "version": TUNE_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "headprobe_version": __version__, "model": lm.identity.to_json(),
        "task": {"kind": task.kind, **task.description}, "grid": {"lengths": task.lengths, "depths": task.depths},
        "max_new_tokens": req.max_new_tokens, "split": req.split.to_json(), "rule": req.rule.to_json(),
        "space": req.space.to_json(), "memory": req.memory, "capacities": capacities,
        "cost": {"search_trials": sum(r.trials for r in search), "holdout_trials": sum(r.trials for r in held),
                 "trials": sum(r.trials for r in outcome.runs), "stages": _stage_cost(outcome),
                 "runs": [r.to_json() for r in outcome.runs],
                 "wall_s": round(outcome.wall_s, 2), "cpu_s": round(outcome.cpu_s, 2), "resumed": resumed,
                 "note": "wall_s and cpu_s are this process's (rank 0's); a resumed run counts only what it ran"},
        "files": files,
    }


def _stage_cost(outcome: TuneOutcome) -> dict[str, dict[str, Any]]:
    """Per stage (selection, allocation, holdout): the trials this process ran and the plan's bound."""
    bound = outcome.plan.to_json() if outcome.plan is not None else {}
    spent: dict[str, dict[str, Any]] = {}
    for r in outcome.runs:
        stage = r.stage.split("-r")[0]
        entry = spent.setdefault(stage, {"trials": 0, "wall_s": 0.0, "at_most": bound.get(stage)})
        entry["trials"] += r.trials
        entry["wall_s"] = round(entry["wall_s"] + r.wall_s, 2)
    return spent


def write_tune_outputs(lm: LoadedModel, outcome: TuneOutcome, out: str | Path, figure: str | Path | None = None,
                  resumed: bool = False, replace: bool = False) -> dict[str, Any]:
    """Write the budget maps, the report and its figure (rank 0); returns the report.

    Parameters
    ----------
    replace
        Whether existing outputs may be replaced: what :func:`check_tune_outputs` allowed before the run
        (``force``, or ``resume`` of the run that wrote them). Without it a file that appeared while the
        run worked (another run's) is refused as it is written, and nothing of it is replaced.
    """
    out = Path(out)
    folder = out.parent
    files: dict[str, str] = {"report": out.name, "runs": out.with_name(out.stem + ".runs").name}
    strings: dict[int, str] = {}
    for cap, setting in outcome.chosen.items():
        path = map_path(out, cap)
        window = chosen_window(setting, outcome.windows)
        bm = chosen_map(lm, setting, window, outcome.request.profile_dirs, out)
        bm.save(path, force=replace)
        files[f"budget_map_{cap}"] = path.name
        strings[cap] = map_setting_string(setting, path)
        check = EvalSetting.parse(strings[cap])
        if check.policy != setting.policy or _filled(check) != _filled(setting):
            raise HeadprobeError(f"{strings[cap]}: does not read back to {setting.label}")
    if figure is not None:
        files["figure"] = str(Path(figure).resolve().relative_to(folder.resolve())) \
            if Path(figure).resolve().is_relative_to(folder.resolve()) else str(figure)
    report = build_report(outcome, lm, files, strings, resumed)
    atomic_write_json(out, report, overwrite=replace)
    if figure is not None:
        # matplotlib loads only when the report draws its figures
        from ..plots.profile_figures import save_figure
        from .figure import tune_figure

        save_figure(tune_figure(report), figure, force=replace)
    return report


def load_tune_report(path: str | Path) -> dict[str, Any]:
    """Read a tune report (format and version checked)."""
    return read_headprobe_file(path, TUNE_FORMAT, TUNE_VERSION)


def format_tune_report(report: dict[str, Any]) -> str:
    """A short text table per capacity: the chosen setting and the presets on the held-out items."""
    lines = []
    for cap in report["capacities"]:
        ch = cap["chosen"]
        cal = ch["calibration"]
        lines.append(f"capacity {cap['capacity']}: chosen {ch['label']}  (calibration {cal['accuracy']:.3f} "
                     f"[{cal['interval'][0]:.2f}, {cal['interval'][1]:.2f}], n={cal['n']})")
        if cal["n"] and cal["accuracy"] == 0:
            lines.append(f"  no finding: the chosen setting answered none of its {cal['n']} calibration items, so the "
                         "search had no score to rank by and fell to its tie-break (fewest bytes); give the cache "
                         "more room or calibrate on items it can answer")
        if ch.get("setting_string"):
            lines.append(f"  setting: {ch['setting_string']}")
        lines.append(f"  {'held-out':<44} {'acc':>6} {'interval':>14} {'chosen - it':>16} {'cache MiB':>10}")
        for r in sorted(cap["holdout"], key=lambda r: -r["accuracy"]):
            lead = r.get("chosen_minus_this")
            lead_text = f"[{lead[0]:+.2f}, {lead[1]:+.2f}]" if lead else "-"
            mark = "*" if r["chosen"] else " "
            lines.append(f" {mark}{r['label']:<44} {r['accuracy']:>6.3f} [{r['interval'][0]:.2f}, {r['interval'][1]:.2f}]"
                         f" {lead_text:>16} {r['cache_bytes'] / 2**20:>10.2f}")
        best = cap.get("best_preset_holdout")
        if best:
            lines.append(f"  best preset on the held-out items: {best['label']} ({best['verdict']})")
    cost = report["cost"]
    lines.append(f"trials: {cost['search_trials']} searching, {cost['holdout_trials']} held out; "
                 f"{cost['wall_s']:.0f} s wall, {cost['cpu_s']:.0f} s CPU")
    for stage, entry in cost.get("stages", {}).items():
        bound = f" of at most {entry['at_most']}" if entry.get("at_most") is not None else ""
        lines.append(f"  {stage}: {entry['trials']} trials{bound}, {entry['wall_s']:.0f} s")
    return "\n".join(lines)


__all__ = ("TUNE_FORMAT", "TUNE_VERSION", "build_report", "check_tune_outputs", "chosen_map", "chosen_window",
           "figure_path", "format_tune_report", "load_tune_report", "map_path", "map_setting_string", "output_files",
           "write_tune_outputs")
