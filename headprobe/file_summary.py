"""Load any headprobe file by its format, and summarise it in a few lines (``headprobe inspect``)."""

from __future__ import annotations

from pathlib import Path

from .budget_map import BUDGET_FORMAT, BudgetMap
from .errors import FileFormatError
from .eval.result import EVAL_FORMAT, EvalResult, format_eval_summary
from .files.jsonio import read_json
from .files.trial_log import read_log
from .layer_split import LayerSplit
from .probes.aggregate import check_trial_records, read_profile_log
from .profile import PROFILE_FORMAT, Profile


def load_file(path: str | Path) -> Profile | BudgetMap | EvalResult:
    """Load a profile, a budget map or an eval result, telling which from the file's ``format``.

    Raises
    ------
    FileFormatError
        If the file is none of them, or not a valid one.
    """
    obj = read_json(path)
    fmt = obj.get("format") if isinstance(obj, dict) else None
    if fmt == PROFILE_FORMAT:
        return Profile.load(path)
    if fmt == BUDGET_FORMAT:
        return BudgetMap.load(path)
    if fmt == EVAL_FORMAT:
        return EvalResult.load(path)
    raise FileFormatError(path, "format",
                          f"expected '{PROFILE_FORMAT}', '{BUDGET_FORMAT}' or '{EVAL_FORMAT}', found {fmt!r}")


def summarize_file(path: str | Path, top: int = 10) -> list[str]:
    """Validate ``path`` (profile, budget map, or a trial, cell or run log) and return summary lines.

    Raises
    ------
    FileFormatError
        If the file is not a valid headprobe file.
    """
    path = Path(path)
    if path.suffix == ".jsonl":
        return _summarize_log(path)
    obj = read_json(path)
    if isinstance(obj, dict) and obj.get("format") == "headprobe.layer_split":
        return _summarize_split(path)
    loaded = load_file(path)
    if isinstance(loaded, Profile):
        return _summarize_profile(loaded, path, top)
    if isinstance(loaded, EvalResult):
        return [f"{path}: headprobe eval v1, task {loaded.task.get('kind')}, created {loaded.created}",
                *format_eval_summary(loaded).splitlines()]
    return _summarize_budget(loaded, path)


def _model_line(model) -> str:
    kinds = sorted(set(model.layer_types))
    return (f"model      {model.name} ({model.architecture}; {model.num_layers} layers, {model.num_query_heads} "
            f"query heads, {model.num_kv_heads} KV heads, head_dim {model.head_dim}; {', '.join(kinds)}; "
            f"fingerprint {model.fingerprint})")


def _summarize_profile(profile: Profile, path: Path, top: int) -> list[str]:
    lines = [f"{path}: headprobe profile v1, kind {profile.kind}, created {profile.created}", _model_line(profile.model)]
    probe = profile.probe
    if "lengths" in probe:
        lines.append(f"probe      mode {_mode(probe)}; lengths {probe.get('lengths')}; "
                     f"{len(probe.get('depths', []))} depths; seeds {probe.get('seeds')}; gate {probe.get('gate')}")
    elif "source" in probe:
        lines.append(f"source     {probe['source']}")
    t = profile.trials
    if t.get("per_task"):
        lines.append(f"samples    {t['total']} prompts: " + ", ".join(f"{k} {v}" for k, v in t["per_task"].items()))
    elif t.get("total"):
        lines.append(f"trials     {t['passed']}/{t['total']} passed the {t.get('gate', 'gate')} gate"
                     + (f" (by gate: {t['passed_by_gate']})" if t.get("passed_by_gate") else ""))
    for needle, c in (t.get("per_needle") or {}).items():
        lines.append(f"  needle {needle:<10} {c['passed']:>4}/{c['total']:<4} passed ({100 * c['passed'] / max(1, c['total']):.0f}%)")
    if profile.query_heads is not None:
        flat = [s for row in profile.query_heads for s in row]
        zeros = sum(1 for s in flat if s == 0)
        lines.append(f"scores     {len(flat)} query heads; {100 * zeros / len(flat):.0f}% exactly 0; "
                     f"{sum(1 for s in flat if s > 0.1)} above 0.1; max {max(flat):.4f}; "
                     f"KV heads by {profile.group_reduction}")
        lines += _top_head_lines(profile, top)
    if t.get("stopping"):
        lines.append(_stopping_line(t["stopping"]))
    if profile.retention:
        for task, r in profile.retention.items():
            best = sorted(range(len(r.mean)), key=lambda i: -r.mean[i])[:5]
            lines.append(f"retention  {task:<20} {r.samples} samples; top layers "
                         + ", ".join(f"{i} ({r.mean[i]:.3f}±{r.std[i]:.3f})" for i in best))
    return lines


def _mode(settings: dict) -> str:
    """``fast``, ``reference`` or ``reuse (recompute share 10%)``."""
    mode = settings.get("mode")
    if mode == "reuse" and settings.get("recompute_share") is not None:
        return f"reuse (recompute share {100 * settings['recompute_share']:g}%)"
    return str(mode)


def _top_head_lines(profile: Profile, top: int) -> list[str]:
    """The top heads, with their bootstrap intervals when the profile has them."""
    iv = profile.intervals
    if not iv:
        heads = ", ".join(f"{l}-{h} ({s:.3f})" for l, h, s in profile.top_heads(top))
        return [f"top heads  {heads}  (layer-queryhead)"]
    header = (f"top heads  (layer-queryhead: mean over passing trials [{100 * iv['level']:g}% bootstrap interval, "
              f"{iv['resamples']} resamples of {iv.get('trials', '?')} trials])")
    lines = [header]
    for rank, (l, h, s) in enumerate(profile.top_heads(top), 1):
        lines.append(f"  {rank:>3}. {l}-{h:<4} {s:.4f} [{iv['low'][l][h]:.4f}, {iv['high'][l][h]:.4f}]")
    jac = iv.get("top_k_jaccard") or {}
    if jac:
        lines.append("stability  top-k heads across resamples (mean Jaccard with the profile's): "
                     + ", ".join(f"top-{k} {v:.2f}" for k, v in jac.items()))
    return lines


def _stopping_line(stop: dict) -> str:
    rule = stop.get("rule", {})
    if stop.get("stable"):
        outcome = f"top-{rule.get('k')} stable (Jaccard {stop.get('jaccard')} >= {rule.get('jaccard')})"
    else:
        outcome = f"top-{rule.get('k')} not stable (Jaccard {stop.get('jaccard')}, rule >= {rule.get('jaccard')})"
    return (f"stopping   until stable: {stop.get('trials_run')} of {stop.get('grid_trials')} grid trials run "
            f"in spread order; {outcome}")


def _summarize_budget(budget: BudgetMap, path: Path) -> list[str]:
    flat = sorted(b for row in budget.budgets for b in row)
    m = budget.method
    return [
        f"{path}: headprobe budget map v1, granularity {budget.granularity}, created {budget.created}",
        _model_line(budget.model),
        "method     " + ", ".join(f"{k}={v}" for k, v in m.items() if k not in ("sources", "split") and v is not None),
        f"totals     {budget.total} tokens; per head min {flat[0]}, median {flat[len(flat) // 2]}, max {flat[-1]}",
        "per layer  " + " ".join(str(x) for x in budget.per_layer),
    ]


def _summarize_split(path: Path) -> list[str]:
    """A layer split (``headprobe.layer_split``): its engine, global layers, windows and bytes."""
    split = LayerSplit.load(path)
    windows = sorted({w for w in split.layers if w != "global"})
    kept, full = split.kept_bytes(), split.full_bytes()
    return [
        f"{path}: headprobe layer split v1 for {split.engine}, created {split.created}",
        _model_line(split.model),
        f"layers     global {split.global_layers}; local windows {windows}, sink {split.sink}",
        f"keeps      {kept:,} of {full:,} bytes ({kept / full:.1%}) at {split.context} tokens ({split.dtype})",
    ]


def _summarize_log(path: Path) -> list[str]:
    """A profile's trial log, an eval's cell log or an ablation's run log (all three share the format
    ``headprobe.trials``), told apart by their settings; anything else is refused."""
    settings, trials = read_log(path)
    if "pass" in settings:
        return _summarize_trial_log(path, settings, trials)
    if isinstance(settings.get("task"), dict) and isinstance(settings.get("settings"), list):
        return _summarize_cell_log(path, settings, trials)
    if "profile" in settings and isinstance(settings.get("ks"), list):
        return _summarize_run_log(path, settings, trials)
    raise FileFormatError(path, "settings", "expected the header of a profile's trial log (with 'pass'), an eval's "
                          "cell log (with 'task' and 'settings') or an ablation's run log (with 'profile' and 'ks')")


def _summarize_cell_log(path: Path, settings: dict, cells: list[dict]) -> list[str]:
    task = settings["task"]
    labels = [s.get("label") if isinstance(s, dict) else None for s in settings["settings"]]
    lengths, depths = settings.get("lengths"), settings.get("depths")
    grid = len(lengths) * len(depths) if isinstance(lengths, list) and isinstance(depths, list) and depths else None
    total = f" of {grid * len(labels)}" if grid else ""
    lines = [(f"{path}: headprobe eval cell log v1, task {task.get('kind')}, {len(labels)} settings, "
              f"{len(cells)}{total} cells finished"),
             f"model      fingerprint {settings.get('model')}; headprobe {settings.get('headprobe_version')}"]
    for label in labels:
        mine = [c for c in cells if c.get("setting") == label]
        accuracy = [c["accuracy"] for c in mine if isinstance(c.get("accuracy"), (int, float))]
        mean = f"mean accuracy {sum(accuracy) / len(accuracy):.3f}" if accuracy else "no cell finished"
        lines.append(f"  setting {label}: {len(mine)} cells; {mean}")
    return lines


def _summarize_run_log(path: Path, settings: dict, runs: list[dict]) -> list[str]:
    ks = settings["ks"]
    return [(f"{path}: headprobe ablation run log v1, heads masked {ks}, {len(runs)} of {1 + 2 * len(ks)} runs "
             "finished (baseline, top-k and random-k)"),
            f"model      fingerprint {settings.get('model')}; profile fingerprint {settings.get('profile')}",
            "runs       " + (", ".join(r["trial"] for r in runs) or "none")]


def _summarize_trial_log(path: Path, settings: dict, trials: list[dict]) -> list[str]:
    """A profile's trial log, checked as ``profile --resume`` and ``--merge`` check it (header and every
    record, naming the line and field of a bad one)."""
    settings, numbered = read_profile_log(path)
    check_trial_records(settings, [(f"{path}:{line}", record) for line, record in numbered])
    model = settings.get("model")
    lines = [(f"{path}: headprobe trial log v1, pass {settings.get('pass')}, mode {_mode(settings)}, "
              f"{len(trials)} trials"), f"model      {model.get('name') if isinstance(model, dict) else model}"]
    if isinstance(settings.get("until_stable"), dict):
        rule = settings["until_stable"]
        lines.append(f"stopping   until the top-{rule.get('k')} heads are stable (bootstrap Jaccard >= "
                     f"{rule.get('jaccard')}), checked every {rule.get('check_every')} trials")
    if settings.get("pass") != "layer_retention":
        gate = settings.get("gate", "published")
        passed = sum(1 for t in trials if isinstance(t.get("gates"), dict) and t["gates"].get(gate))
        lines.append(f"passed     {passed}/{len(trials)} ({gate} gate)")
    return lines
