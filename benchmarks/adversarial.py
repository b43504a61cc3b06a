"""Hostile commands against the headprobe command line, each judged against what it declares correct.

    python benchmarks/adversarial.py [--work DIR] [--keep] [--only GLOB] [--skip GLOB] [--fast] [--list]

The cases: hand-edited profiles, budget maps, trial logs and score files given to every command that reads
them; bad flags; concurrent runs writing one output; a full disk (a small tmpfs when this process may
mount one, else a file-size limit, a real short write the kernel refuses with EFBIG); read-only folders
(a read-only tmpfs when mountable, else a folder without write permission); SIGINT, SIGTERM and kill -9
in the middle of a run, then ``--resume``; locks left behind, locks that are folders, locks held by a live
process; damaged model files and a Hub that fails. The models are the tiny random Llama the tests use
(saved once to the work folder) and SmolLM2-135M (loaded offline).

Each case declares the correct outcome (a refusal, a success whose outputs headprobe's own readers accept
and that mean what they say, or either) and is classified as:

- ``clean refusal``: a refusal as declared: exit status 2, one ``headprobe: error:`` line, no traceback,
  nothing left behind;
- ``correct``: a success as declared, its outputs checked;
- ``traceback``: an uncaught exception;
- ``silent wrong``: exit 0 where a refusal was declared, or an output that is wrong or that headprobe's own
  reader refuses;
- ``lost``: a result replaced or removed that had to stay, or a resumed run that differs from an
  uninterrupted one;
- ``wrongly refused``: a refusal where a success was declared;
- ``messy``: a refusal in more than one line, with another exit status, or that left files behind.

Every case that is not ``clean refusal`` or ``correct`` is printed with what happened; the counts and the
wall time come last. ``--fast`` leaves out the cases that run SmolLM2 (signals, full-disk profiling,
concurrent profile runs, generate with budget maps).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import fnmatch
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "cli")]
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", MPLBACKEND="Agg",
                  OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))

CLEAN, CORRECT, TRACEBACK, WRONG, LOST, REFUSED, MESSY = (
    "clean refusal", "correct", "traceback", "silent wrong", "lost", "wrongly refused", "messy")
ORDER = (CLEAN, CORRECT, TRACEBACK, WRONG, LOST, REFUSED, MESSY)
SMOL = "smollm2-135m"
SMOL_NAME = "HuggingFaceTB/SmolLM2-135M-Instruct"


# ---- running the command line ---------------------------------------------------------------------

@dataclass
class Result:
    """One command's exit status (``None``: an uncaught exception), output and traceback."""

    rc: int | None
    out: str
    err: str
    tb: str | None = None

    @property
    def errors(self) -> list[str]:
        """The ``headprobe: error:`` lines (a progress bar may share a line with one)."""
        return [line[line.index("headprobe: error:"):] for line in self.err.splitlines()
                if "headprobe: error:" in line]

    @property
    def crashed(self) -> bool:
        return self.tb is not None or "Traceback (most recent call last)" in self.err


def cli(*argv: Any) -> Result:
    """Run ``headprobe ARGV`` in this process (stdout and stderr captured; an escaping exception kept)."""
    from headprobe_cli.main import main

    out, err = io.StringIO(), io.StringIO()
    tb = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("default")
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as exc:                          # argparse's refusals
            rc = exc.code if isinstance(exc.code, int) else 2
        except BaseException:   # noqa: BLE001  (what the case is looking for)
            rc, tb = None, traceback.format_exc()
    return Result(rc, out.getvalue(), err.getvalue(), tb)


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "cli"), env.get("PYTHONPATH", "")])
    env.update(extra or {})
    return env


def start(*argv: Any, env: dict[str, str] | None = None, fsize: int | None = None) -> subprocess.Popen:
    """Start ``headprobe ARGV`` in its own process (SIGINT acts as Ctrl-C there)."""
    code = ("import signal, sys\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "if sys.argv[1] != '-':\n    import resource\n    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), int(sys.argv[1])))\n"
            "from headprobe_cli.main import main\nsys.exit(main(sys.argv[2:]))\n")
    return subprocess.Popen([sys.executable, "-c", code, "-" if fsize is None else str(fsize), *map(str, argv)],
                            env=_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 900) -> Result:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return Result(None, out, err + "\n(timed out)", "timed out")
    return Result(proc.returncode, out, err)


def sub(*argv: Any, env: dict[str, str] | None = None, fsize: int | None = None, timeout: float = 900) -> Result:
    return finish(start(*argv, env=env, fsize=fsize), timeout)


# ---- judging ------------------------------------------------------------------------------------

def snapshot(path: Path) -> Any:
    """What a file or folder holds, for telling whether it changed."""
    path = Path(path)
    if path.is_dir():
        return {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    return path.read_bytes() if path.exists() else None


def judge(res: Result, want: str, check: Callable[[], str | None] | None = None,
          keep: Iterable[tuple[Path, Any]] = (), absent: Iterable[Path] = (), message: str | None = None,
          ) -> tuple[str, str]:
    """Classify one command's outcome against ``want`` (``"ok"``, ``"refuse"`` or ``"either"``).

    ``check`` returns what is wrong with a success's outputs (``None``: nothing); ``keep`` are
    ``(path, snapshot)`` pairs that must not change; ``absent`` the paths a refusal must not leave;
    ``message`` a text the refusal must contain.
    """
    if res.crashed:
        last = (res.tb or res.err).strip().splitlines()
        return TRACEBACK, last[-1][:200] if last else "traceback"
    for path, before in keep:
        if snapshot(path) != before:
            return LOST, f"{path} changed or went"
    refused = res.rc not in (0, None)
    if want == "either" and not refused or want == "ok":
        if refused:
            return REFUSED, (res.errors or [f"exit {res.rc}"])[0][:300]
        problem = check() if check else None
        return (WRONG, problem) if problem else (CORRECT, "")
    if not refused:
        problem = check() if (want == "either" and check) else None
        if want == "either":
            return (WRONG, problem) if problem else (CORRECT, "")
        return WRONG, "exit 0 where a refusal was declared" + (f": {res.out.strip()[-200:]}" if res.out else "")
    if res.rc != 2 or len(res.errors) != 1:
        return MESSY, f"exit {res.rc}, {len(res.errors)} error lines: {res.err.strip()[-300:]}"
    left = [str(p) for p in absent if Path(p).exists()]
    if left:
        return MESSY, f"refused ({res.errors[0][:150]}) but left {', '.join(left)}"
    if message and message not in res.errors[0]:
        return MESSY, f"refused without saying {message!r}: {res.errors[0][:300]}"
    return CLEAN, res.errors[0]


# ---- the work folder and what the cases start from -----------------------------------------------

@dataclass
class Work:
    root: Path
    fast: bool
    no_mounts: bool = False
    made: dict[str, Any] = field(default_factory=dict)
    mounts: list[Path] = field(default_factory=list)
    _count: Counter = field(default_factory=Counter)

    def dir(self, name: str) -> Path:
        """A new empty folder for one case."""
        self._count[name] += 1
        path = self.root / "cases" / f"{name}.{self._count[name]}"
        path.mkdir(parents=True)
        return path

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        if key not in self.made:
            self.made[key] = make()
        return self.made[key]

    # -- fixtures --
    def tiny(self) -> Path:
        """The tiny random Llama of the tests, saved as a model folder named ``tiny``."""
        def make():
            sys.path.insert(0, str(ROOT / "tests"))
            from conftest import save_tiny_llama

            folder = self.root / "models" / "tiny"
            folder.mkdir(parents=True)
            with contextlib.redirect_stderr(io.StringIO()):
                return save_tiny_llama(folder)
        return self.once("tiny", make)

    def profile(self) -> Path:
        """SmolLM2's shipped retrieval profile, with bootstrap intervals where it has none."""
        def make():
            import headprobe

            obj = json.loads((ROOT / "profiles" / "smollm2-135m.retrieval.json").read_text())
            q = obj["scores"]["query_heads"]
            obj.setdefault("intervals", {"method": "bootstrap", "resamples": 200, "level": 0.9, "seed": 0,
                                         "trials": obj["trials"]["passed"], "low": [[x * 0.9 for x in r] for r in q],
                                         "high": [[x * 1.1 for x in r] for r in q], "top_k_jaccard": {"10": 0.9}})
            path = _write(self.root / "fixtures" / "smollm2-135m.retrieval.json", obj)
            headprobe.Profile.load(path)
            return path
        return self.once("profile", make)

    def profile_obj(self) -> dict:
        return json.loads(self.profile().read_text())

    def budget(self) -> Path:
        def make():
            path = self.root / "fixtures" / "b.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            res = cli("allocate", "--profile", ROOT / "profiles" / "smollm2-135m.retrieval_reasoning.json",
                      "--capacity", 128, "--window", 8, "-o", path)
            assert res.rc == 0, res.err
            return path
        return self.once("budget", make)

    def shards(self) -> list[Path]:
        """Two shard logs of a SmolLM2-shaped retrieval pass (records as the probes write them)."""
        def make():
            return synthetic_shards(self.root / "fixtures" / "shards", 2)
        return self.once("shards", make)

    def eval_log(self) -> Path:
        def make():
            out = self.root / "fixtures" / "eval" / "e.json"
            res = cli("eval", "--model", self.tiny(), "--device", "cpu", "--settings", "full", "streaming",
                      "--capacities", 16, "--lengths", 300, "--depths", 0, 100, "--needle-ids", "r01",
                      "--max-new-tokens", 2, "--no-chat-template", "--plot", "none", "--out", out)
            assert res.rc == 0, res.err
            return out
        return self.once("eval", make)


def synthetic_shards(folder: Path, n: int, name: str = "smollm2-135m", depths=(0.0, 0.25, 0.5, 0.75, 1.0),
                     seed: int = 0) -> list[Path]:
    """``n`` shard logs of a retrieval pass for SmolLM2's shape, with random sparse scores."""
    import numpy as np

    from headprobe.files.trial_log import TrialLog
    from headprobe.models.identity import ModelIdentity
    from headprobe.probes.trial_grid import make_grid, shard_trials

    identity = ModelIdentity(name=SMOL_NAME, source="hub:" + SMOL_NAME, architecture="llama", num_layers=30,
                             num_query_heads=9, num_kv_heads=3, head_dim=64, layer_types=("full_attention",) * 30,
                             max_context=8192)
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    grid = make_grid(["r01", "r02"], [300], list(depths), [0])
    paths = []
    for i in range(n):
        settings = {"model": identity.to_json(), "mode": "fast", "chat_template": False, "headprobe_version": "test",
                    "group_reduction": "mean", "pass": "retrieval", "probes": ["retrieval", "enhanced_retrieval"],
                    "lengths": [300], "depths": list(depths), "seeds": [0],
                    "needle_set": {"path": "needles/retrieval.jsonl", "shipped": True, "fingerprint": "f" * 16,
                                   "ids": ["r01", "r02"]},
                    "haystack": {"name": "headprobe-corpus", "fingerprint": "h" * 16}, "gate": "published",
                    "max_new_tokens": 24, "shard": [i, n]}
        path = folder / f"{name}.retrieval.shard{i}of{n}.trials.jsonl"
        with TrialLog(path, settings) as log:
            for spec in shard_trials(grid, (i, n)):
                log.append({"trial": spec.id, "needle": spec.needle_id, "length": spec.length, "depth": spec.depth,
                            "seed": spec.seed, "gates": {"published": True, "rouge1_recall": 1.0}, "passed": True,
                            "scores": {k: rng.gamma(0.3, 0.05, size=(30, 9)).round(6).tolist()
                                       for k in ("retrieval", "enhanced_retrieval")}, "seconds": 0.1})
        paths.append(path)
    return paths


# ---- checks of outputs, by the readers that will read them ---------------------------------------

def _read_back(path: Path, kind: str) -> str | None:
    """Whether the file headprobe wrote at ``path`` reads back through its own reader (``kind``: the file
    type's class name) and the summary ``inspect`` prints."""
    import headprobe

    try:
        getattr(headprobe, kind).load(path)
        headprobe.summarize_file(path)
    except headprobe.HeadprobeError as exc:
        return f"{path.name} was written but its own reader refuses it: {exc}"
    return None


def check_budget_file(path: Path) -> str | None:
    return _read_back(path, "BudgetMap")


def check_png(path: Path) -> str | None:
    if not path.is_file():
        return f"{path.name} was not written"
    return None if path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" else f"{path.name} is not a PNG"


def check_duo(folder: Path) -> str | None:
    """The folder reads back, and DuoAttention's own cut (its eval patch casts each row to the model's dtype,
    then keeps heads above 0.5) gives the full heads the config names in every dtype."""
    import numpy as np
    import torch

    from headprobe import HeadprobeError
    from headprobe.tool_files.duoattention import read_tsv

    tsv, config = folder / "full_attention_heads.tsv", folder / "config.json"
    if not (tsv.is_file() and config.is_file()):
        return f"{folder.name} lacks {'the TSV' if not tsv.is_file() else 'config.json'}"
    try:
        values = np.clip(read_tsv(tsv), 0, 1)
    except HeadprobeError as exc:
        return f"the TSV was written but headprobe's reader refuses it: {exc}"
    info = json.loads(config.read_text()).get("headprobe")
    if info is None:
        return None                                     # --exact: the stored scores
    counts = {str(d): int(sum((torch.tensor(row, dtype=d) > 0.5).sum() for row in values))
              for d in (torch.float32, torch.float16, torch.bfloat16)}
    if len(set(counts.values())) != 1 or next(iter(counts.values())) != info["full_heads"]:
        return f"DuoAttention's cut gives {counts} full heads; the config says {info['full_heads']}"
    return None


def check_headkv_export(path: Path, profile: Path) -> str | None:
    import numpy as np

    import headprobe
    from headprobe.tool_files.headkv_json import read_headkv_json

    p = headprobe.Profile.load(profile)
    try:
        back = read_headkv_json(path, model=p.model)
    except headprobe.HeadprobeError as exc:
        return f"the export was written but headprobe's reader refuses it: {exc}"
    if not np.allclose(back.query_heads, p.query_heads, rtol=1e-12, atol=0):
        return "the export's means differ from the profile's scores"
    return None


def check_layers(path: Path) -> str | None:
    from headprobe import HeadprobeError
    from headprobe.tool_files.layer_list import read_layer_list

    try:
        read_layer_list(path)
    except HeadprobeError as exc:
        return f"the layer list was written but its reader refuses it: {exc}"
    return None


def check_ratios(path: Path, bm_path: Path, prompt_len: int) -> str | None:
    data = json.loads(path.read_text())
    bm = json.loads(bm_path.read_text())
    window = (bm.get("method") or {}).get("window") or 0
    kept = [int(prompt_len * (1 - r)) for r in data["compression_ratios"]]
    if kept != data["kept_per_head"]:
        return "kvpress keeps other counts than the file says"
    if min(kept) < window:
        return f"a layer keeps {min(kept)} tokens a head, below the map's window {window}"
    return None


def check_profile_file(path: Path) -> str | None:
    return _read_back(path, "Profile")


def same_profile(a: Path, b: Path) -> str | None:
    """Whether two needle profiles hold the same result (scores, intervals, trial counts); times aside."""
    x, y = json.loads(a.read_text()), json.loads(b.read_text())
    for key in ("scores", "intervals"):
        if x.get(key) != y.get(key):
            return f"{key} differ from the uninterrupted run's"
    tx = {k: v for k, v in x["trials"].items() if k != "mean_seconds"}
    ty = {k: v for k, v in y["trials"].items() if k != "mean_seconds"}
    return None if tx == ty else "trial counts differ from the uninterrupted run's"


def whole_lines(log: Path) -> str | None:
    text = log.read_text() if log.exists() else ""
    if text and not text.endswith("\n"):
        return f"{log.name} ends in a torn line"
    for line in text.splitlines():
        try:
            json.loads(line)
        except json.JSONDecodeError:
            return f"{log.name} holds a line that is not JSON"
    return None


# ---- cases --------------------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    run: Callable[[Work], tuple[str, str]]
    slow: bool = False


CASES: list[Case] = []


def case(name: str, slow: bool = False):
    def register(fn):
        CASES.append(Case(name, fn, slow))
        return fn
    return register


def _write(path: Path, content: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content, allow_nan=True))
    return path


def _set(obj: dict, dotted: str, value: Any) -> dict:
    keys = dotted.split(".")
    target = obj
    for k in keys[:-1]:
        target = target[int(k)] if isinstance(target, list) else target[k]
    last = keys[-1]
    if value is _DELETE:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return obj


_DELETE = object()


# -- hand-edited profiles, given to every command that reads a profile --

def _grid(rows: int, cols: int, value: Any) -> list:
    return [[value] * cols for _ in range(rows)]


def profile_mutations() -> list[tuple[str, Callable[[dict], Any], dict[str, str]]]:
    """``(name, edit, expectations)``; ``edit`` returns the new JSON (or raw text/bytes); expectations by
    command, ``"refuse"`` for every command not named."""
    ok_all = {c: "ok" for c in PROFILE_COMMANDS}
    zero = {"inspect": "ok", "plot": "ok", "export-headkv": "ok"}
    negative = {"inspect": "ok", "plot": "ok", "export-duo": "either", "export-headkv": "refuse"}   # no probe makes one
    huge = {"inspect": "ok", "plot": "ok", "allocate": "ok", "allocate-compat": "either", "export-duo": "ok",
            "export-headkv": "ok"}
    q, kv = "scores.query_heads", "scores.kv_heads"

    def scores(value):
        def edit(o):
            o["scores"]["query_heads"] = _grid(30, 9, value)
            o["scores"]["kv_heads"] = _grid(30, 3, value)
            o.pop("intervals", None)
            return o
        return edit

    return [
        ("not-json", lambda o: "{", {}),
        ("empty-file", lambda o: "", {}),
        ("a-list", lambda o: [o], {}),
        ("utf8-bom", lambda o: "\ufeff" + json.dumps(o), {}),
        ("not-utf8", lambda o: b"\xff\xfe" + json.dumps(o).encode(), {}),
        ("deep-nesting", lambda o: "[" * 100_000 + "]" * 100_000, {}),
        ("trailing-garbage", lambda o: json.dumps(o) + " }", {}),
        ("format-budget", lambda o: _set(o, "format", "headprobe.budget"), {}),
        ("format-missing", lambda o: _set(o, "format", _DELETE), {}),
        ("version-string", lambda o: _set(o, "version", "1"), {}),
        ("version-future", lambda o: _set(o, "version", 99), {}),
        ("version-bool", lambda o: _set(o, "version", True), {}),
        ("kind-bogus", lambda o: _set(o, "kind", "bogus"), {}),
        ("kind-missing", lambda o: _set(o, "kind", _DELETE), {}),
        ("model-missing", lambda o: _set(o, "model", _DELETE), {}),
        ("model-layers-string", lambda o: _set(o, "model.num_layers", "30"), {}),
        ("model-layers-zero", lambda o: _set(o, "model.num_layers", 0), {}),
        ("model-groups-uneven", lambda o: _set(o, "model.num_kv_heads", 4), {}),
        ("probe-not-object", lambda o: _set(o, "probe", [1]), {}),
        ("trials-total-string", lambda o: _set(o, "trials.total", "6"), {}),
        ("trials-per-needle-list", lambda o: _set(o, "trials.per_needle", [1]), {}),
        ("scores-missing", lambda o: _set(_set(o, "scores", _DELETE), "intervals", _DELETE), {}),
        ("query-rows-short", lambda o: _set(o, q, o["scores"]["query_heads"][:29]), {}),
        ("query-row-short", lambda o: _set(o, f"{q}.3", o["scores"]["query_heads"][3][:8]), {}),
        ("query-nan", lambda o: _set(o, f"{q}.1.2", float("nan")), {}),
        ("query-infinity", lambda o: _set(o, f"{q}.1.2", float("inf")), {}),
        ("query-string", lambda o: _set(o, f"{q}.1.2", "0.5"), {}),
        ("query-bool", lambda o: _set(o, f"{q}.1.2", True), {}),
        ("query-null", lambda o: _set(o, f"{q}.1.2", None), {}),
        ("kv-rows-short", lambda o: _set(o, kv, o["scores"]["kv_heads"][:29]), {}),
        ("reduction-bogus", lambda o: _set(o, "scores.group_reduction", "median"), {}),
        ("intervals-level-2", lambda o: _set(o, "intervals.level", 2), {}),
        ("intervals-low-short", lambda o: _set(o, "intervals.low", o["intervals"]["low"][:3]), {}),
        ("retention-empty", lambda o: _set(o, "retention", {"tasks": {}}), {}),
        ("negative-score", lambda o: _set(o, f"{q}.0.0", -1.0), negative),
        ("all-zero", scores(0.0), zero),
        ("all-huge", scores(1e308), huge),
        ("one-huge", lambda o: _set(_set(o, f"{q}.0.0", 1e308), "intervals", _DELETE), huge),
        ("tiny-denormal", scores(5e-324), huge),
        ("unknown-fields", lambda o: {**o, "extra": {"x": 1}}, ok_all),
        ("unchanged", lambda o: o, ok_all),
    ]


PROFILE_COMMANDS = ("inspect", "plot", "allocate", "allocate-compat", "export-duo", "export-headkv")


def _profile_case(name: str, edit: Callable[[dict], Any], command: str, want: str):
    def run(work: Work) -> tuple[str, str]:
        d = work.dir(f"profile-{name}-{command}")
        src = _write(d / "p.json", edit(copy.deepcopy(work.profile_obj())))
        keep = [(src, snapshot(src))]
        if command == "inspect":
            return judge(cli("inspect", src), want, keep=keep)
        if command == "plot":
            out = d / "o.png"
            return judge(cli("plot", src, "-o", out), want, lambda: check_png(out), keep, [out])
        if command in ("allocate", "allocate-compat"):
            out = d / "b.json"
            extra = ["--compat", "headkv"] if command == "allocate-compat" else []
            return judge(cli("allocate", "--profile", src, "--capacity", 64, *extra, "-o", out), want,
                         lambda: check_budget_file(out), keep, [out])
        if command == "export-duo":
            out = d / "duo"
            return judge(cli("export", src, "--to", "duoattention", "-o", out), want, lambda: check_duo(out),
                         keep, [out])
        out = d / "x_heads.json"
        return judge(cli("export", src, "--to", "headkv", "-o", out), want,
                     lambda: check_headkv_export(out, src), keep, [out])
    return run


for _name, _edit, _wants in profile_mutations():
    for _command in PROFILE_COMMANDS:
        case(f"profile/{_name}/{_command}")(_profile_case(_name, _edit, _command, _wants.get(_command, "refuse")))


# -- hand-edited budget maps --

BUDGET_COMMANDS = ("inspect", "plot", "export-layers", "export-kvpress", "export-duo", "generate")


def budget_mutations() -> list[tuple[str, Callable[[dict], Any], dict[str, str]]]:
    ok_all = {c: "ok" for c in BUDGET_COMMANDS}
    readable = {"inspect": "ok", "plot": "ok"}

    def consistent_totals(o):
        # the edit under test is the budgets themselves: the totals say what they hold
        o["totals"]["total"] = sum(map(sum, o["budgets"]))
        if "per_layer" in o["totals"]:
            o["totals"]["per_layer"] = [sum(row) for row in o["budgets"]]
        return o

    def budgets(value):
        def edit(o):
            o["budgets"] = _grid(30, 3, value)
            if isinstance(value, int):
                return consistent_totals(o)
            o["totals"]["total"] = 0
            return o
        return edit

    def compat(o):
        o["granularity"] = "query_head"
        o["shares"] = [[s / 3 for s in row for _ in range(3)] for row in o["shares"]]
        o["budgets"] = [[b for b in row for _ in range(3)] for row in o["budgets"]]
        return consistent_totals(o)

    def big(o):
        o["budgets"] = [[b * 40 for b in row] for row in o["budgets"]]
        return consistent_totals(o)

    return [
        ("not-json", lambda o: "{", {}),
        ("a-list", lambda o: [o], {}),
        ("format-profile", lambda o: _set(o, "format", "headprobe.profile"), {}),
        ("version-future", lambda o: _set(o, "version", 99), {}),
        ("granularity-bogus", lambda o: _set(o, "granularity", "layer"), {}),
        ("model-missing", lambda o: _set(o, "model", _DELETE), {}),
        ("method-not-object", lambda o: _set(o, "method", "headkv"), {}),
        ("allocator-missing", lambda o: _set(o, "method.allocator", _DELETE), {}),
        ("shares-rows-short", lambda o: _set(o, "shares", o["shares"][:29]), {}),
        ("shares-sum-half", lambda o: _set(o, "shares", [[s / 2 for s in r] for r in o["shares"]]), {}),
        ("shares-negative", lambda o: _set(o, "shares.0.0", -0.01), {}),
        ("shares-nan", lambda o: _set(o, "shares.0.0", float("nan")), {}),
        ("budget-float", lambda o: _set(o, "budgets.0.0", 1.5), {}),
        ("budget-negative", lambda o: _set(o, "budgets.0.0", -5), {}),
        ("budget-huge", lambda o: _set(o, "budgets.0.0", 10 ** 30), {}),
        ("budget-string", lambda o: _set(o, "budgets.0.0", "8"), {}),
        ("totals-wrong", lambda o: _set(o, "totals.total", 1), {}),
        ("totals-missing", lambda o: _set(o, "totals", _DELETE), {c: "either" for c in BUDGET_COMMANDS}),
        ("all-zero", budgets(0), readable),
        ("below-window", budgets(7), readable),
        ("compat-query-heads", compat, {"inspect": "ok", "plot": "ok", "export-layers": "ok"}),
        ("beyond-the-context", big, {"inspect": "ok", "plot": "ok", "export-layers": "ok", "export-duo": "ok",
                                     "generate": "ok"}),
        ("other-model", lambda o: _set(o, "model.num_layers", 18) and _set(o, "model.name", "other/model")
         and o, {}),
        ("unknown-fields", lambda o: {**o, "extra": 1}, ok_all),
        ("unchanged", lambda o: o, ok_all),
    ]


def _budget_case(name: str, edit: Callable[[dict], Any], command: str, want: str):
    def run(work: Work) -> tuple[str, str]:
        d = work.dir(f"budget-{name}-{command}")
        src = _write(d / "b.json", edit(json.loads(work.budget().read_text())))
        keep = [(src, snapshot(src))]
        if command == "inspect":
            return judge(cli("inspect", src), want, keep=keep)
        if command == "plot":
            out = d / "o.png"
            return judge(cli("plot", src, "-o", out), want, lambda: check_png(out), keep, [out])
        if command == "export-layers":
            out = d / "l.json"
            return judge(cli("export", src, "--to", "layers", "-o", out), want, lambda: check_layers(out), keep,
                         [out])
        if command == "export-kvpress":
            out = d / "r.json"
            return judge(cli("export", src, "--to", "kvpress-layers", "--prompt-len", 4000, "-o", out), want,
                         lambda: check_ratios(out, src, 4000), keep, [out])
        if command == "export-duo":
            out = d / "duo"
            return judge(cli("export", src, "--to", "duoattention", "-o", out), want, lambda: check_duo(out), keep,
                         [out])
        res = cli("generate", "--model", SMOL, "--device", "cpu", "--budget", src, "--max-new-tokens", 2, "--no-chat",
                  "The capital of France is")
        return judge(res, want, lambda: None if "cache:" in res.out else "no cache report", keep)
    return run


for _name, _edit, _wants in budget_mutations():
    for _command in BUDGET_COMMANDS:
        _want = _wants.get(_command, "refuse")
        case(f"budget/{_name}/{_command}", slow=_command == "generate" and _want != "refuse")(
            _budget_case(_name, _edit, _command, _want))


# -- hand-edited shard logs: inspect and merge --

def log_mutations() -> list[tuple[str, Callable[[list[str]], str], dict[str, str]]]:
    """Edits of shard 0's lines (header first); expectations for inspect and merge."""
    def record(lines, i, fn):
        rec = json.loads(lines[i])
        fn(rec)
        lines[i] = json.dumps(rec, allow_nan=True)
        return "\n".join(lines) + "\n"

    def header(lines, fn):
        h = json.loads(lines[0])
        fn(h)
        lines[0] = json.dumps(h)
        return "\n".join(lines) + "\n"

    both = {"inspect": "ok", "merge": "ok"}
    # inspect checks a trial log as --resume and --merge do (header and every record), but not that the
    # grid is complete: a single shard, or one a trial short, is a sound log
    return [
        ("header-missing", lambda ls: "\n".join(ls[1:]) + "\n", {}),
        ("header-format", lambda ls: header(ls, lambda h: h.update(format="headprobe.cells")), {}),
        ("header-version-2", lambda ls: header(ls, lambda h: h.update(version=2)), {}),
        ("settings-a-list", lambda ls: header(ls, lambda h: h.update(settings=[1])), {}),
        ("settings-model-string", lambda ls: header(ls, lambda h: h["settings"].update(model="x")), {}),
        ("middle-line-not-json", lambda ls: "\n".join(ls[:2] + ["{oops"] + ls[2:]) + "\n", {}),
        ("torn-last-line", lambda ls: "\n".join(ls) + "\n" + ls[-1][:40], {"inspect": "ok", "merge": "ok"}),
        ("torn-record-dropped", lambda ls: "\n".join(ls[:-1]) + "\n" + ls[-1][:40], {"inspect": "ok"}),
        ("duplicate-record", lambda ls: "\n".join(ls + [ls[1]]) + "\n", both),
        ("blank-lines", lambda ls: "\n\n".join(ls) + "\n", both),
        ("crlf", lambda ls: "\r\n".join(ls) + "\r\n", both),
        ("record-a-list", lambda ls: "\n".join(ls[:1] + ["[1, 2]"] + ls[2:]) + "\n", {}),
        ("record-no-id", lambda ls: record(ls, 1, lambda r: r.pop("trial")), {}),
        ("score-nan", lambda ls: record(ls, 1, lambda r: r["scores"]["retrieval"][1].__setitem__(2, float("nan"))),
         {}),
        ("score-negative", lambda ls: record(ls, 1, lambda r: r["scores"]["retrieval"][1].__setitem__(2, -0.5)), {}),
        ("score-huge", lambda ls: record(ls, 1, lambda r: r["scores"].update(
            retrieval=_grid(30, 9, 1e308))), {"inspect": "either"}),    # no probe makes such a score
        ("all-scores-huge", lambda ls: "\n".join([ls[0]] + [json.dumps({**json.loads(x), "scores": {
            "retrieval": _grid(30, 9, 1e308), "enhanced_retrieval": _grid(30, 9, 1e308)}}) for x in ls[1:]]) + "\n",
         {"inspect": "either"}),
        ("scores-short", lambda ls: record(ls, 1, lambda r: r["scores"].update(retrieval=r["scores"]["retrieval"][:3])),
         {}),
        ("gates-missing", lambda ls: record(ls, 1, lambda r: r.update(gates={})), {}),
        ("passed-yes", lambda ls: record(ls, 1, lambda r: r.update(passed="yes")), {}),
        ("id-mismatch", lambda ls: record(ls, 1, lambda r: r.update(depth=0.99)), {}),
        ("other-settings", lambda ls: header(ls, lambda h: h["settings"].update(lengths=[400])), {"inspect": "ok"}),
        ("shard-5-of-2", lambda ls: header(ls, lambda h: h["settings"].update(shard=[5, 2])), {"inspect": "either"}),
        ("extra-fields", lambda ls: record(ls, 1, lambda r: r.update(note="x")), both),
        ("empty-file", lambda ls: "", {}),
        ("unchanged", lambda ls: "\n".join(ls) + "\n", both),
    ]


def _log_case(name: str, edit: Callable[[list[str]], str], command: str, want: str):
    def run(work: Work) -> tuple[str, str]:
        d = work.dir(f"log-{name}-{command}")
        s0, s1 = work.shards()
        log = _write(d / s0.name, edit(s0.read_text().splitlines()))
        other = shutil.copy(s1, d / s1.name)
        keep = [(log, snapshot(log))]
        if command == "inspect":
            return judge(cli("inspect", log), want, keep=keep)
        out = d / "out"
        return judge(cli("profile", "--merge", log, other, "--out-dir", out), want,
                     lambda: check_profile_file(out / "smollm2-135m.retrieval.json"), keep, [out])
    return run


for _name, _edit, _wants in log_mutations():
    for _command in ("inspect", "merge"):
        case(f"log/{_name}/{_command}")(_log_case(_name, _edit, _command, _wants.get(_command, "refuse")))


@case("log/same-shard-twice/merge")
def _same_shard_twice(work: Work) -> tuple[str, str]:
    s0, s1 = work.shards()
    d = work.dir("same-shard-twice")
    return judge(cli("profile", "--merge", s0, s0, s1, "--out-dir", d / "out"), "refuse", absent=[d / "out"])


@case("log/name-escapes-out-dir/merge")
def _name_escape(work: Work) -> tuple[str, str]:
    s0, s1 = work.shards()
    d = work.dir("name-escape")
    escaped = d / "escape.retrieval.json"
    return judge(cli("profile", "--merge", s0, s1, "--out-dir", d / "a" / "b", "--name", "../../escape"), "refuse",
                 absent=[escaped])


@case("log/eval-cell-log/inspect")
def _inspect_cells(work: Work) -> tuple[str, str]:
    import headprobe

    res = cli("inspect", headprobe.frontend.cell_log_path(work.eval_log()))
    return judge(res, "ok", lambda: None if "eval cell log" in res.out else f"summarised as {res.out[:80]!r}")


@case("log/eval-result/inspect")
def _inspect_eval_result(work: Work) -> tuple[str, str]:
    return judge(cli("inspect", work.eval_log()), "either")


# -- score files and pattern folders to import --

def _headkv(value: Any, n_layers: int = 30, heads: int = 9) -> dict:
    obj = {f"{layer}-{h}": [0.5] for layer in range(n_layers) for h in range(heads)}
    obj["0-0"] = value
    return obj


IMPORTS = [
    ("headkv-scalar-5", lambda: _headkv(5), "refuse"),
    ("headkv-empty-list", lambda: _headkv([]), "refuse"),
    ("headkv-string", lambda: _headkv("high"), "refuse"),
    ("headkv-nan", lambda: _headkv([float("nan")]), "refuse"),
    ("headkv-huge-pair", lambda: _headkv([1e308, 1e308]), "ok"),
    ("headkv-bad-key", lambda: {**_headkv([1.0]), "zero-one": [1.0]}, "refuse"),
    ("headkv-missing-head", lambda: {k: v for k, v in _headkv([1.0]).items() if k != "5-5"}, "refuse"),
    ("headkv-beyond-model", lambda: {**_headkv([1.0]), "40-0": [1.0]}, "refuse"),
    ("headkv-huge-index", lambda: {"20000-20000": [1.0]}, "refuse"),
    ("headkv-not-object", lambda: [1, 2], "refuse"),
    ("headkv-ok", lambda: _headkv([0.25, 0.75]), "ok"),
]


def _import_case(name: str, make: Callable[[], Any], want: str):
    def run(work: Work) -> tuple[str, str]:
        d = work.dir(f"import-{name}")
        src = _write(d / "x_retrieval_heads.json", make())
        out = d / "p.json"
        return judge(cli("import", src, "--model", SMOL, "-o", out), want, lambda: check_profile_file(out),
                     [(src, snapshot(src))], [out])
    return run


for _name, _make, _want in IMPORTS:
    case(f"import/{_name}")(_import_case(_name, _make, _want))

TSVS = [
    ("tsv-ragged", "0.1\t0.2\t0.3\n" * 29 + "0.1\t0.2\n", "refuse"),
    ("tsv-nan", "0.1\tnan\t0.3\n" * 30, "refuse"),
    ("tsv-words", "a\tb\tc\n" * 30, "refuse"),
    ("tsv-empty", "", "refuse"),
    ("tsv-rows-short", "0.1\t0.9\t0.3\n" * 29, "refuse"),
    ("tsv-ok", "0.1\t0.9\t0.3\n" * 30, "ok"),
]


def _tsv_case(name: str, text: str, want: str):
    def run(work: Work) -> tuple[str, str]:
        d = work.dir(f"import-{name}")
        folder = d / "pattern"
        _write(folder / "full_attention_heads.tsv", text)
        _write(folder / "config.json", {"sink_size": 64, "recent_size": 256})
        out = d / "p.json"
        return judge(cli("import", folder, "--model", SMOL, "-o", out), want, lambda: check_profile_file(out),
                     absent=[out])
    return run


for _name, _text, _want in TSVS:
    case(f"import/{_name}")(_tsv_case(_name, _text, _want))


@case("import/folder-without-tsv")
def _import_empty_folder(work: Work) -> tuple[str, str]:
    d = work.dir("import-empty-folder")
    (d / "pattern").mkdir()
    return judge(cli("import", d / "pattern", "--from", "duoattention", "--model", SMOL, "-o", d / "p.json"),
                 "refuse", absent=[d / "p.json"])


# -- flags that do not fit, checked before any model loads (or once it is loaded) --

FLAGS: list[tuple[str, list[Any], str]] = [
    ("profile/lengths-0", ["profile", "--model", "@tiny", "--lengths", 0, "--depths", 50, "--out-dir", "@d"], "refuse"),
    ("profile/lengths-negative", ["profile", "--model", "@tiny", "--lengths", -5, "--out-dir", "@d"], "refuse"),
    ("profile/lengths-beyond-context", ["profile", "--model", "@tiny", "--device", "cpu", "--probe", "retrieval",
                                        "--lengths", 100000, "--depths", 50, "--needles", "r01", "--out-dir", "@d"],
     "refuse"),
    ("profile/depths-150", ["profile", "--model", "@tiny", "--lengths", 300, "--depths", 150, "--out-dir", "@d"],
     "refuse"),
    ("profile/depths-negative", ["profile", "--model", "@tiny", "--lengths", 300, "--depths", -1, "--out-dir", "@d"],
     "refuse"),
    ("profile/needles-unknown", ["profile", "--model", "@tiny", "--lengths", 300, "--needles", "zz9",
                                 "--out-dir", "@d"], "refuse"),
    ("profile/probe-bogus", ["profile", "--model", "@tiny", "--probe", "bogus", "--out-dir", "@d"], "refuse"),
    ("profile/batch-size-0", ["profile", "--model", "@tiny", "--lengths", 300, "--batch-size", 0, "--out-dir", "@d"],
     "refuse"),
    ("profile/needle-file-missing", ["profile", "--model", "@tiny", "--needle-file", "@d/none.jsonl",
                                     "--out-dir", "@d"], "refuse"),
    ("profile/needle-file-folder", ["profile", "--model", "@tiny", "--needle-file", "@d", "--out-dir", "@d/o"],
     "refuse"),
    ("profile/haystack-missing", ["profile", "--model", "@tiny", "--haystack", "@d/none.txt", "--out-dir", "@d"],
     "refuse"),
    ("profile/out-dir-a-file", ["profile", "--model", "@tiny", "--lengths", 300, "--out-dir", "@file/sub"], "refuse"),
    ("profile/recompute-share-in-fast-mode", ["profile", "--model", "@tiny", "--mode", "fast", "--recompute-share",
                                              50, "--lengths", 300, "--out-dir", "@d"], "refuse"),
    ("profile/stable-k-without-until-stable", ["profile", "--model", "@tiny", "--stable-k", 0, "--lengths", 300,
                                               "--out-dir", "@d"], "refuse"),
    ("profile/shard-bad", ["profile", "--model", "@tiny", "--shard", "3/2", "--out-dir", "@d"], "refuse"),
    ("profile/model-empty-folder", ["profile", "--model", "@d", "--out-dir", "@d/o"], "refuse"),
    ("profile/model-no-user", ["profile", "--model", "~nosuchuser/x", "--out-dir", "@d/o"], "refuse"),
    ("profile/model-alias-typo", ["profile", "--model", "smolm2-135m", "--out-dir", "@d/o"], "refuse"),
    ("allocate/task-bogus", ["allocate", "--method", "dynamickv", "--task", "bogus", "-o", "@d/b.json"], "refuse"),
    ("allocate/capacity-0", ["allocate", "--profile", "@profile", "--capacity", 0, "-o", "@d/b.json"], "refuse"),
    ("allocate/capacity-1e20", ["allocate", "--profile", "@profile", "--capacity", "1e20", "-o", "@d/b.json"],
     "refuse"),
    ("allocate/beta-negative", ["allocate", "--profile", "@profile", "--beta", -1, "-o", "@d/b.json"], "refuse"),
    ("allocate/window-negative", ["allocate", "--profile", "@profile", "--window", -1, "-o", "@d/b.json"], "refuse"),
    ("allocate/temperature-0", ["allocate", "--profile", "@profile", "--temperature", 0, "-o", "@d/b.json"], "refuse"),
    ("allocate/prompt-len-negative", ["allocate", "--profile", "@profile", "--prompt-len", -5, "--clamp", "-o",
                                      "@d/b.json"], "refuse"),
    ("allocate/profile-missing", ["allocate", "--profile", "@d/none.json", "-o", "@d/b.json"], "refuse"),
    ("allocate/method-bogus", ["allocate", "--profile", "@profile", "--method", "bogus", "-o", "@d/b.json"], "refuse"),
    ("allocate/ok", ["allocate", "--profile", "@profile", "--capacity", 64, "-o", "@d/b.json"], "ok"),
    ("generate/capacity-0", ["generate", "--model", "@tiny", "--capacity", 0, "hi"], "refuse"),
    ("generate/max-new-tokens-0", ["generate", "--model", "@tiny", "--max-new-tokens", 0, "hi"], "refuse"),
    ("generate/ratio-2", ["generate", "--model", "@tiny", "--device", "cpu", "--ratio", 2, "hi"], "refuse"),
    ("generate/ratio-negative", ["generate", "--model", "@tiny", "--device", "cpu", "--ratio", -0.1, "hi"], "refuse"),
    ("generate/policy-bogus", ["generate", "--model", "@tiny", "--policy", "bogus", "hi"], "refuse"),
    ("generate/window-negative", ["generate", "--model", "@tiny", "--option", "window=-1", "hi"], "refuse"),
    ("generate/option-unknown", ["generate", "--model", "@tiny", "--option", "block_size=3", "hi"], "refuse"),
    ("generate/prompt-file-missing", ["generate", "--model", "@tiny", "--prompt-file", "@d/none.txt"], "refuse"),
    ("generate/prompt-file-folder", ["generate", "--model", "@tiny", "--prompt-file", "@d"], "refuse"),
    ("generate/prompt-beyond-context", ["generate", "--model", "@tiny", "--device", "cpu", "--no-chat",
                                        "--prompt-file", "@long"], "refuse"),
    ("generate/new-tokens-beyond-context", ["generate", "--model", "@tiny", "--device", "cpu", "--no-chat",
                                            "--max-new-tokens", 5000, "hello there"], "refuse"),
    ("generate/budget-other-model", ["generate", "--model", "@tiny", "--device", "cpu", "--budget", "@budget",
                                     "hi"], "refuse"),
    ("generate/budget-not-a-budget", ["generate", "--model", "@tiny", "--budget", "@profile", "hi"], "refuse"),
    ("generate/ok", ["generate", "--model", "@tiny", "--device", "cpu", "--no-chat", "--max-new-tokens", 2,
                     "--capacity", 32, "hello there"], "ok"),
    ("eval/duplicate-option", ["eval", "--model", "@tiny", "--settings", "headkv-r[window=32,window=8]",
                               "--out", "@d/e.json"], "refuse"),
    ("eval/capacity-0", ["eval", "--model", "@tiny", "--settings", "full", "--capacities", 0, "--out", "@d/e.json"],
     "refuse"),
    ("eval/settings-bogus", ["eval", "--model", "@tiny", "--settings", "bogus", "--out", "@d/e.json"], "refuse"),
    ("eval/lengths-0", ["eval", "--model", "@tiny", "--settings", "full", "--lengths", 0, "--out", "@d/e.json"],
     "refuse"),
    ("eval/out-a-folder", ["eval", "--model", "@tiny", "--settings", "full", "--out", "@d"], "refuse"),
    ("eval/plot-format-bogus", ["eval", "--model", "@tiny", "--settings", "full", "--plot", "@d/x.gif",
                                "--out", "@d/e.json"], "refuse"),
    ("export/threshold-nan", ["export", "@profile", "--to", "duoattention", "--threshold", "nan", "-o", "@d/duo"],
     "refuse"),
    ("export/full-share-2", ["export", "@profile", "--to", "duoattention", "--full-share", 2, "-o", "@d/duo"],
     "refuse"),
    ("export/sink-size-negative", ["export", "@profile", "--to", "duoattention", "--sink-size", -5, "-o", "@d/duo"],
     "refuse"),
    ("export/recent-size-0", ["export", "@profile", "--to", "duoattention", "--recent-size", 0, "-o", "@d/duo"],
     "refuse"),
    ("export/exact-with-share", ["export", "@profile", "--to", "duoattention", "--exact", "--full-share", 0.5,
                                 "-o", "@d/duo"], "refuse"),
    ("export/headkv-from-budget", ["export", "@budget", "--to", "headkv", "-o", "@d/h.json"], "refuse"),
    ("export/layers-from-profile", ["export", "@profile", "--to", "layers", "-o", "@d/l.json"], "refuse"),
    ("export/kvpress-without-length", ["export", "@budget", "--to", "kvpress-layers", "-o", "@d/r.json"], "refuse"),
    ("plot/three-files", ["plot", "@profile", "@profile", "@profile", "-o", "@d/p.png"], "refuse"),
    ("plot/compare-with-budget", ["plot", "@profile", "@budget", "-o", "@d/p.png"], "refuse"),
    ("plot/format-bogus", ["plot", "@profile", "--format", "gif", "-o", "@d/p.gif"], "refuse"),
    ("inspect/missing-file", ["inspect", "@d/none.json"], "refuse"),
    ("inspect/folder", ["inspect", "@d"], "refuse"),
    # users' data files and flags that do not apply to them
    ("profile/contexts-non-utf8", ["profile", "--model", "@tiny", "--contexts", "@badutf8", "--out-dir", "@d/o"],
     "refuse"),
    ("profile/contexts-empty", ["profile", "--model", "@tiny", "--contexts", "@empty", "--out-dir", "@d/o"], "refuse"),
    ("profile/contexts-role-twice", ["profile", "--model", "@tiny", "--contexts", "@qa", "--fields",
                                     "context=doc,question=q,context=q", "--out-dir", "@d/o"], "refuse"),
    ("profile/contexts-with-lengths", ["profile", "--model", "@tiny", "--contexts", "@qa", "--lengths", 300,
                                       "--out-dir", "@d/o"], "refuse"),
    ("profile/contexts-with-depths", ["profile", "--model", "@tiny", "--contexts", "@qa", "--probe", "query_focus",
                                      "--depths", 50, "--out-dir", "@d/o"], "refuse"),
    ("profile/contexts-with-needles", ["profile", "--model", "@tiny", "--contexts", "@qa", "--needles", "r01",
                                       "--out-dir", "@d/o"], "refuse"),
    ("profile/contexts-with-gate", ["profile", "--model", "@tiny", "--contexts", "@qa", "--probe", "query_focus",
                                    "--gate", "likelihood", "--out-dir", "@d/o"], "refuse"),
    ("eval/dataset-non-utf8", ["eval", "--model", "@tiny", "--task", "dataset", "--dataset", "@badutf8",
                               "--settings", "full", "--out", "@d/e.json"], "refuse"),
    ("eval/dataset-empty", ["eval", "--model", "@tiny", "--task", "dataset", "--dataset", "@empty",
                            "--settings", "full", "--out", "@d/e.json"], "refuse"),
    ("eval/dataset-role-twice", ["eval", "--model", "@tiny", "--task", "dataset", "--dataset", "@qa", "--fields",
                                 "context=doc,question=q,context=q", "--settings", "full", "--out", "@d/e.json"],
     "refuse"),
    ("eval/dataset-with-lengths", ["eval", "--model", "@tiny", "--task", "dataset", "--dataset", "@qa",
                                   "--lengths", 300, "--settings", "full", "--out", "@d/e.json"], "refuse"),
    ("eval/dataset-split-of-a-file", ["eval", "--model", "@tiny", "--task", "dataset", "--dataset", "@qa",
                                      "--split", "test", "--settings", "full", "--out", "@d/e.json"], "refuse"),
    ("tune/context-beyond-the-model", ["tune", "--model", SMOL, "--cache-share", "5%", "--context", 10000000,
                                       "--out", "@d/t.json"], "refuse"),
    ("tune/babi-with-needle-ids", ["tune", "--model", "@tiny", "--task", "babi", "--needle-ids", "r01",
                                   "--out", "@d/t.json"], "refuse"),
    ("tune/resume-and-force", ["tune", "--model", "@tiny", "--resume", "--force", "--out", "@d/t.json"], "refuse"),
    ("tune/values-task-bogus", ["tune", "--model", "@tiny", "--values", "task=bogus", "--out", "@d/t.json"],
     "refuse"),
]

#: What the data-file placeholders of :data:`FLAGS` hold: QA rows, a row of Latin-1 bytes, an empty file.
QA_ROWS = [{"id": f"q{i}", "context": f"The blue box holds {i} marbles. " * 3, "question": "How many marbles?",
            "answer": str(i)} for i in range(3)]


def _flag_case(name: str, argv: list[Any], want: str):
    def run(work: Work) -> tuple[str, str]:
        d = work.dir(f"flags-{name.replace('/', '-')}")
        (d / "file").write_text("x")
        subs = {"@tiny": str(work.tiny()), "@d": str(d), "@file": str(d / "file"), "@profile": str(work.profile()),
                "@budget": str(work.budget())}
        subs["@qa"] = str(_write(d / "qa.jsonl", "".join(json.dumps(r) + "\n" for r in QA_ROWS)))
        subs["@empty"] = str(_write(d / "empty.jsonl", ""))
        bad = d / "latin1.jsonl"
        bad.write_bytes(json.dumps(QA_ROWS[0]).encode() + b"\n" + b'{"context": "caf\xe9", "question": "q", '
                        b'"answer": "caf"}\n')
        subs["@badutf8"] = str(bad)
        if any(isinstance(a, str) and a == "@long" for a in argv):
            subs["@long"] = str(_write(d / "long.txt", "The river ran past the old mill in the rain. " * 800))
        args = []
        for a in argv:
            for key in sorted(subs, key=len, reverse=True):
                if isinstance(a, str) and a.startswith(key):
                    a = subs[key] + a[len(key):]
                    break
            args.append(a)
        before = sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))
        res = cli(*args)
        after = sorted(p.relative_to(d).as_posix() for p in d.rglob("*"))
        new = [d / p for p in after if p not in before]

        def check():
            if name == "allocate/ok":
                return check_budget_file(d / "b.json")
            return None
        return judge(res, want, check, absent=new if want == "refuse" else ())
    return run


for _name, _argv, _want in FLAGS:
    case(f"flags/{_name}")(_flag_case(_name, _argv, _want))


# -- outputs that exist, and outputs written by another run meanwhile --

@case("outputs/existing-profile-refused-before-the-model-loads")
def _existing_profile(work: Work) -> tuple[str, str]:
    d = work.dir("existing-profile")
    target = shutil.copy(work.profile(), d / "tiny.retrieval.json")
    return judge(cli("profile", "--model", work.tiny(), "--device", "cpu", "--probe", "retrieval", "--lengths", 300,
                     "--depths", 50, "--needles", "r01", "--no-chat-template", "--out-dir", d), "refuse",
                 keep=[(Path(target), snapshot(Path(target)))])


EXISTING = [
    ("plot", lambda w, out: ["plot", w.profile(), "-o", out], "p.png"),
    ("allocate", lambda w, out: ["allocate", "--profile", w.profile(), "-o", out], "b.json"),
    ("import", lambda w, out: ["import", _write(out.parent / "src" / "x_retrieval_heads.json", _headkv([0.5])),
                               "--model", SMOL, "-o", out], "p.json"),
    ("export-duo", lambda w, out: ["export", w.profile(), "--to", "duoattention", "-o", out], "duo"),
    ("export-headkv", lambda w, out: ["export", w.profile(), "--to", "headkv", "-o", out], "h.json"),
    ("export-layers", lambda w, out: ["export", w.budget(), "--to", "layers", "-o", out], "l.json"),
    ("export-kvpress", lambda w, out: ["export", w.budget(), "--to", "kvpress-layers", "--prompt-len", 4000,
                                       "-o", out], "r.json"),
]


def _existing_case(name: str, argv: Callable[[Work, Path], list[Any]], target: str):
    def run(work: Work) -> tuple[str, str]:
        d = work.dir(f"existing-{name}")
        out = d / target
        if target == "duo":
            _write(out / "full_attention_heads.tsv", "someone's pattern\n")
        else:
            _write(out, "someone's result")
        keep = [(out, snapshot(out))]
        verdict = judge(cli(*argv(work, out)), "refuse", keep=keep, message="--force")
        if verdict[0] != CLEAN:
            return verdict
        res = cli(*argv(work, out), "--force")                   # --force replaces it
        return judge(res, "ok", lambda: None if snapshot(out) != keep[0][1] else "--force did not replace it")
    return run


for _name, _argv, _target in EXISTING:
    case(f"outputs/existing-{_name}")(_existing_case(_name, _argv, _target))


def _race(work: Work, name: str, first: list[Any], second: list[Any], target: Path,
          expected: Callable[[Path], str | None]) -> tuple[str, str]:
    """Two commands writing ``target`` at once: at most one may succeed, and what is on disk must be the
    successful one's result (``expected(target)`` says what is wrong with it otherwise)."""
    a, b = start(*first), start(*second)
    ra, rb = finish(a), finish(b)
    for r in (ra, rb):
        if r.crashed:
            return TRACEBACK, (r.err.strip().splitlines() or ["?"])[-1][:200]
    winners = [r for r in (ra, rb) if r.rc == 0]
    if len(winners) == 2:
        return LOST, "both runs exit 0 and report writing the same output: one result was replaced"
    if not winners:
        return REFUSED, f"both refused: {ra.errors[:1]} {rb.errors[:1]}"
    loser = rb if winners[0] is ra else ra
    if len(loser.errors) != 1 or loser.rc != 2:
        return MESSY, f"the second writer: exit {loser.rc}, {loser.err.strip()[-200:]}"
    problem = expected(target, winners[0] is ra)
    return (LOST, problem) if problem else (CLEAN, loser.errors[0])



@case("race/two-merges-one-folder")
def _race_merges(work: Work) -> tuple[str, str]:
    d = work.dir("race-merges")
    first = synthetic_shards(d / "first", 2, seed=1)
    second = synthetic_shards(d / "second", 3, seed=2)
    out = d / "SAME"
    target = out / "smollm2-135m.retrieval.json"

    def expected(path, first_won):
        shards = sorted(map(tuple, json.loads(path.read_text())["probe"]["merged_shards"]))
        want = [(0, 2), (1, 2)] if first_won else [(0, 3), (1, 3), (2, 3)]
        return None if shards == want else f"the profile on disk is the refused merge's ({shards})"
    return _race(work, "merges", ["profile", "--merge", *first, "--out-dir", out],
                 ["profile", "--merge", *second, "--out-dir", out], target, expected)


@case("race/two-exports-one-folder")
def _race_exports(work: Work) -> tuple[str, str]:
    d = work.dir("race-exports")
    out = d / "duo"

    def expected(path, first_won):
        problem = check_duo(path)
        if problem:
            return problem
        share = json.loads((path / "config.json").read_text())["headprobe"]["value"]
        return None if share == (0.25 if first_won else 0.75) else "the folder holds the refused export"
    return _race(work, "exports", ["export", work.profile(), "--to", "duoattention", "--full-share", 0.25, "-o", out],
                 ["export", work.profile(), "--to", "duoattention", "--full-share", 0.75, "-o", out], out, expected)


@case("race/two-plots-one-file")
def _race_plots(work: Work) -> tuple[str, str]:
    d = work.dir("race-plots")
    out = d / "p.png"
    return _race(work, "plots", ["plot", work.profile(), "-o", out],
                 ["plot", ROOT / "profiles" / "smollm2-135m.retrieval_reasoning.json", "-o", out], out,
                 lambda path, first_won: check_png(path))


@case("race/two-imports-one-file")
def _race_imports(work: Work) -> tuple[str, str]:
    d = work.dir("race-imports")
    a = _write(d / "a" / "x_retrieval_heads.json", _headkv([0.25]))
    b = _write(d / "b" / "x_retrieval_heads.json", _headkv([0.75]))
    out = d / "p.json"

    def expected(path, first_won):
        score = json.loads(path.read_text())["scores"]["query_heads"][0][0]
        return None if score == (0.25 if first_won else 0.75) else "the profile on disk is the refused import's"
    return _race(work, "imports", ["import", a, "--model", SMOL, "-o", out], ["import", b, "--model", SMOL, "-o", out],
                 out, expected)


@case("race/two-allocates-one-file")
def _race_allocates(work: Work) -> tuple[str, str]:
    d = work.dir("race-allocates")
    out = d / "b.json"

    def expected(path, first_won):
        capacity = json.loads(path.read_text())["method"].get("capacity")
        return None if capacity == (64 if first_won else 96) else "the map on disk is the refused run's"
    return _race(work, "allocates", ["allocate", "--profile", work.profile(), "--capacity", 64, "-o", out],
                 ["allocate", "--profile", work.profile(), "--capacity", 96, "-o", out], out, expected)


@case("race/two-evals-one-result")
def _race_evals(work: Work) -> tuple[str, str]:
    d = work.dir("race-evals")
    out = d / "e.json"
    argv = ["eval", "--model", work.tiny(), "--device", "cpu", "--capacities", 16, "--lengths", 300,
            "--depths", 0, 100, "--needle-ids", "r01", "--max-new-tokens", 2, "--no-chat-template", "--plot", "none",
            "--out", out]

    def expected(path, first_won):
        labels = [s["label"] for s in json.loads(path.read_text())["settings"]]
        return None if labels == (["full"] if first_won else ["streaming@16"]) else "the result is the refused run's"
    return _race(work, "evals", [*argv, "--settings", "full"], [*argv, "--settings", "streaming"], out, expected)


@case("race/profile-run-and-merge-one-folder", slow=True)
def _race_profile_and_merge(work: Work) -> tuple[str, str]:
    """A profile run, and a merge into its --out-dir that finishes while it runs: the run must not replace
    the merged profile (nor exit 0)."""
    d = work.dir("race-profile-merge")
    out = d / "D"
    shards = synthetic_shards(d / "shards", 2)
    run = start("profile", "--model", SMOL, "--device", "cpu", "--probe", "retrieval", "--lengths", 300,
                "--depths", 0, 20, 40, 60, 80, 100, "--needles", "r01", "r02", "--batch-size", 1, "--out-dir", out)
    log = out / "smollm2-135m.retrieval.trials.jsonl"
    deadline = time.monotonic() + 600
    while not (log.exists() and len(log.read_text().splitlines()) >= 2) and run.poll() is None:
        if time.monotonic() > deadline:
            run.kill()
            return MESSY, "the profile run logged no trial in 10 minutes"
        time.sleep(0.2)
    merged = cli("profile", "--merge", *shards, "--out-dir", out)
    target = out / "smollm2-135m.retrieval.json"
    kept = snapshot(target)
    if merged.rc != 0:
        finish(run)
        return MESSY, f"the merge did not run: {merged.errors[:1]}"
    res = finish(run)
    return judge(res, "refuse", keep=[(target, kept)], message="exists")


# -- full disk --

def _mount(work: Work, name: str, size: str, read_only: bool = False) -> Path | None:
    """A tmpfs of ``size`` at a new folder (``None`` when this process may not mount one)."""
    if work.no_mounts:
        return None
    target = work.root / "mounts" / name
    target.mkdir(parents=True, exist_ok=True)
    opts = f"size={size},mode=0777"
    if subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(target)], capture_output=True,
                      check=False).returncode != 0:
        return None
    work.mounts.append(target)
    return target


def _full(work: Work, name: str, size: str = "16k") -> tuple[Path, int | None]:
    """A folder on a nearly full disk: a small tmpfs, or, where none can be mounted, an ordinary folder and a
    file-size limit for the command (the kernel then cuts writes short and refuses the rest, EFBIG)."""
    mounted = _mount(work, name, size)
    if mounted is not None:
        return mounted, None
    return work.dir(name), 4096


def _fill(folder: Path, leave: int) -> None:
    """Fill a tmpfs but ``leave`` bytes (rounded to pages)."""
    stat = os.statvfs(folder)
    free = stat.f_bavail * stat.f_frsize
    if free > leave:
        with open(folder / ".filler", "wb") as handle:
            handle.write(b"\0" * (free - leave))


FULL = [
    ("plot", lambda w, f: ["plot", w.profile(), "-o", f / "p.png"], "p.png"),
    ("export-duo", lambda w, f: ["export", w.profile(), "--to", "duoattention", "-o", f / "duo"], "duo"),
    ("export-headkv", lambda w, f: ["export", w.profile(), "--to", "headkv", "-o", f / "h.json"], "h.json"),
    ("allocate", lambda w, f: ["allocate", "--profile", w.profile(), "-o", f / "b.json"], "b.json"),
    ("import", lambda w, f: ["import", _write(w.dir("full-import-src") / "x_retrieval_heads.json", _headkv([0.5])),
                             "--model", SMOL, "-o", f / "p.json"], "p.json"),
    ("merge", lambda w, f: ["profile", "--merge", *w.shards(), "--out-dir", f / "out"], "out"),
    ("eval", lambda w, f: ["eval", "--model", w.tiny(), "--device", "cpu", "--settings", "full", "--capacities", 16,
                           "--lengths", 300, "--depths", 0, "--needle-ids", "r01", "--max-new-tokens", 2,
                           "--no-chat-template", "--plot", "none", "--out", f / "e.json"], "e.json"),
]


def _full_case(name: str, argv: Callable[[Work, Path], list[Any]], target: str):
    def run(work: Work) -> tuple[str, str]:
        folder, fsize = _full(work, f"full-{name}", "64k")
        if fsize is None:
            _fill(folder, 1024)
        args = argv(work, folder)
        res = sub(*args, fsize=fsize if fsize is None else 64)
        verdict = judge(res, "refuse", absent=[folder / target])
        if verdict[0] != CLEAN:
            return verdict
        leftovers = [p.name for p in folder.rglob(".*") if p.name != ".filler"]
        if leftovers:
            return MESSY, f"left temporaries {leftovers}"
        if fsize is None:
            (folder / ".filler").unlink()
            again = sub(*args)                              # space freed: the rerun, without --force
        else:
            again = sub(*args)
        return judge(again, "ok") if again.rc != 0 else verdict
    return run


for _name, _argv, _target in FULL:
    case(f"full-disk/{_name}")(_full_case(_name, _argv, _target))


@case("full-disk/profile-then-resume", slow=True)
def _full_profile(work: Work) -> tuple[str, str]:
    """The disk fills while the trial log grows: one line, no torn line; once there is room, --resume
    gives the profile of an uninterrupted run."""
    ref = reference_profile(work)
    lines = [len(x) + 1 for x in (ref.parent / "smollm2-135m.retrieval.trials.jsonl").read_text().splitlines()]
    room = sum(lines[:3]) + lines[3] // 2                # the header and two trials fit, the third does not
    folder, fsize = _full(work, "full-profile", "256k")
    if fsize is None:
        _fill(folder, room)
    argv = ["profile", "--model", SMOL, "--device", "cpu", *REFERENCE_GRID, "--out-dir", folder]
    res = sub(*argv, fsize=None if fsize is None else room)
    log = folder / "smollm2-135m.retrieval.trials.jsonl"
    if res.crashed:
        return TRACEBACK, res.err.strip().splitlines()[-1][:200]
    if res.rc == 0:
        return WRONG, "the run did not notice the full disk"
    if len(res.errors) != 1 or "cannot write" not in res.errors[0]:
        return MESSY, f"{len(res.errors)} error lines: {res.err.strip()[-300:]}"
    torn = whole_lines(log)
    if torn:
        return LOST, torn
    roomy = work.dir("full-profile-roomy")
    for p in folder.iterdir():
        if p.name.endswith(".jsonl"):
            shutil.copy(p, roomy / p.name)
    again = sub("profile", "--model", SMOL, "--device", "cpu", *REFERENCE_GRID, "--out-dir", roomy, "--resume")
    if again.rc != 0:
        return judge(again, "ok")
    problem = same_profile(roomy / "smollm2-135m.retrieval.json", ref)
    return (LOST, problem) if problem else (CLEAN, res.errors[0])


# -- read-only folders --

def _read_only(work: Work, name: str, files: dict[str, Any] | None = None) -> Path:
    """A folder that cannot be written: a tmpfs remounted read-only, or (not root) mode 0555."""
    folder = _mount(work, name, "1m")
    if folder is None:
        folder = work.dir(name)
    for rel, content in (files or {}).items():
        if isinstance(content, Path):
            target = folder / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(content, target)
        else:
            _write(folder / rel, content)
    if folder in work.mounts:
        subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True, capture_output=True)
    else:
        for p in [folder, *folder.rglob("*")]:
            if p.is_dir():
                p.chmod(0o555)
    return folder


READ_ONLY = [
    ("plot", lambda w, f: ["plot", w.profile(), "-o", f / "p.png"], "refuse"),
    ("export-duo", lambda w, f: ["export", w.profile(), "--to", "duoattention", "-o", f / "duo"], "refuse"),
    ("export-headkv", lambda w, f: ["export", w.profile(), "--to", "headkv", "-o", f / "h.json"], "refuse"),
    ("export-kvpress", lambda w, f: ["export", w.budget(), "--to", "kvpress-layers", "--prompt-len", 4000,
                                     "-o", f / "r.json"], "refuse"),
    ("allocate", lambda w, f: ["allocate", "--profile", w.profile(), "-o", f / "b.json"], "refuse"),
    ("import", lambda w, f: ["import", _write(w.dir("ro-import-src") / "x_retrieval_heads.json", _headkv([0.5])),
                             "--model", SMOL, "-o", f / "p.json"], "refuse"),
    ("merge", lambda w, f: ["profile", "--merge", *w.shards(), "--out-dir", f / "out"], "refuse"),
    ("profile", lambda w, f: ["profile", "--model", w.tiny(), "--lengths", 300, "--out-dir", f / "out"], "refuse"),
    ("eval", lambda w, f: ["eval", "--model", w.tiny(), "--settings", "full", "--out", f / "e.json"], "refuse"),
    ("inspect-a-file-there", lambda w, f: ["inspect", f / "p.json"], "ok"),
    ("plot-a-file-there-elsewhere", lambda w, f: ["plot", f / "p.json", "-o", w.dir("ro-plot-out") / "p.png"], "ok"),
    ("resume-a-log-there", lambda w, f: ["profile", "--model", w.tiny(), "--device", "cpu", "--probe", "retrieval",
                                         "--lengths", 300, "--depths", 0, 100, "--needles", "r01",
                                         "--no-chat-template", "--resume", "--out-dir", f], "refuse"),
]


def _ro_case(name: str, argv: Callable[[Work, Path], list[Any]], want: str):
    def run(work: Work) -> tuple[str, str]:
        files = {"p.json": work.profile()}
        if name == "resume-a-log-there":
            tiny_log = work.once("tiny-log", lambda: _tiny_log(work))
            files = {tiny_log.name: tiny_log}
        folder = _read_only(work, f"ro-{name}", files)
        before = snapshot(folder)
        res = sub(*argv(work, folder))
        return judge(res, want, keep=[(folder, before)])
    return run


def _tiny_log(work: Work) -> Path:
    d = work.dir("tiny-log")
    cli("profile", "--model", work.tiny(), "--device", "cpu", "--probe", "retrieval", "--lengths", 300,
        "--depths", 0, 100, "--needles", "r01", "--no-chat-template", "--out-dir", d)
    log = d / "tiny.retrieval.trials.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join(lines[:2]) + "\n")                # one trial short: a resume has work to do
    return log


for _name, _argv, _want in READ_ONLY:
    case(f"read-only/{_name}")(_ro_case(_name, _argv, _want))


# -- signals, then --resume --

REFERENCE_GRID = ["--probe", "retrieval", "--lengths", 300, "--depths", 0, 20, 40, 60, 80, 100, "--needles", "r01",
                  "--batch-size", 1]


def reference_profile(work: Work) -> Path:
    def make():
        d = work.dir("reference")
        res = sub("profile", "--model", SMOL, "--device", "cpu", *REFERENCE_GRID, "--out-dir", d)
        assert res.rc == 0, res.err[-2000:]
        return d / "smollm2-135m.retrieval.json"
    return work.once("reference", make)


def _wait_for_trials(log: Path, proc: subprocess.Popen, n: int, timeout: float = 600) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if log.exists() and len(log.read_text().splitlines()) >= n + 1:
            return True
        time.sleep(0.05)
    return False


def _signal_case(sig: int, extra: tuple[str, ...] = ()):
    def run(work: Work) -> tuple[str, str]:
        ref = reference_profile(work)
        d = work.dir(f"signal-{sig}")
        argv = ["profile", "--model", SMOL, "--device", "cpu", *REFERENCE_GRID, "--out-dir", d]
        if extra:                                        # a finished run, then a forced rerun that is killed
            assert sub(*argv).rc == 0
        proc = start(*argv, *extra)
        log = d / "smollm2-135m.retrieval.trials.jsonl"
        if extra:
            time.sleep(0.5)
        if not _wait_for_trials(log, proc, 2 if not extra else 1):
            finish(proc)
            return MESSY, "the run finished before it could be interrupted"
        proc.send_signal(sig)
        res = finish(proc)
        if res.crashed and sig != signal.SIGINT:
            return TRACEBACK, res.err.strip().splitlines()[-1][:200]
        if sig == signal.SIGINT and (res.rc != 130 or res.crashed):
            return MESSY, f"Ctrl-C: exit {res.rc}: {res.err.strip()[-200:]}"
        torn = whole_lines(log)
        if torn:
            return LOST, torn
        again = sub(*argv, "--resume")          # a killed forced rerun continues from the log it restarted
        if again.rc != 0:
            return judge(again, "ok")
        problem = same_profile(d / "smollm2-135m.retrieval.json", ref)
        return (LOST, problem) if problem else (CORRECT, "")
    return run


for _sig, _label in ((signal.SIGINT, "sigint"), (signal.SIGTERM, "sigterm"), (signal.SIGKILL, "kill-9")):
    case(f"signals/{_label}-then-resume", slow=True)(_signal_case(_sig))
case("signals/kill-9-of-a-forced-rerun-then-resume", slow=True)(_signal_case(signal.SIGKILL, ("--force",)))


@case("signals/eval-kill-9-then-resume")
def _eval_kill(work: Work) -> tuple[str, str]:
    d = work.dir("eval-kill")
    argv = ["eval", "--model", work.tiny(), "--device", "cpu", "--settings", "full", "streaming", "--capacities", 16,
            "--lengths", 300, "--depths", 0, 50, 100, "--needle-ids", "r01", "r02", "--max-new-tokens", 4,
            "--no-chat-template", "--plot", "none"]
    ref = sub(*argv, "--out", d / "ref.json")
    if ref.rc != 0:
        return judge(ref, "ok")
    out = d / "e.json"
    proc = start(*argv, "--out", out)
    import headprobe

    log = headprobe.frontend.cell_log_path(out)
    if not _wait_for_trials(log, proc, 1):
        finish(proc)
        return MESSY, "the eval finished before it could be killed"
    proc.kill()
    finish(proc)
    torn = whole_lines(log)
    if torn:
        return LOST, torn
    again = sub(*argv, "--out", out, "--resume")
    if again.rc != 0:
        return judge(again, "ok")

    def answers(path):
        return [(c["trial"], c["accuracy"], [t.get("answer", t.get("response")) for t in c["trials"]])
                for c in json.loads(path.read_text())["cells"]]
    return (CORRECT, "") if answers(out) == answers(d / "ref.json") else (LOST, "the resumed result differs")


# -- locks --

def _tiny_profile_argv(work: Work, out: Path) -> list[Any]:
    return ["profile", "--model", work.tiny(), "--device", "cpu", "--probe", "retrieval", "--lengths", 300,
            "--depths", 0, 100, "--needles", "r01", "--no-chat-template", "--out-dir", out]


@case("locks/lock-is-a-folder")
def _lock_folder(work: Work) -> tuple[str, str]:
    d = work.dir("lock-folder")
    (d / "tiny.retrieval.trials.jsonl.lock").mkdir()
    return judge(cli(*_tiny_profile_argv(work, d)), "refuse", message="lock")


@case("locks/lock-names-a-live-process")
def _lock_pid1(work: Work) -> tuple[str, str]:
    d = work.dir("lock-pid1")
    (d / "tiny.retrieval.trials.jsonl.lock").write_text("1\n")
    res = cli(*_tiny_profile_argv(work, d))
    # the random model passes no gate: exit 2 after logging its trials; what matters is what the warning says
    if res.crashed:
        return TRACEBACK, res.err.strip().splitlines()[-1][:200]
    if "no longer holds it" in res.err:
        return WRONG, "process 1 runs, but the warning says it ended"
    return (CORRECT, "") if "is running but does not hold it" in res.err else (WRONG, "no warning about the lock")


@case("locks/lock-left-by-a-dead-process")
def _lock_dead(work: Work) -> tuple[str, str]:
    d = work.dir("lock-dead")
    (d / "tiny.retrieval.trials.jsonl.lock").write_text(f"{2 ** 22 + 777}\n")
    res = cli(*_tiny_profile_argv(work, d))
    if res.crashed:
        return TRACEBACK, res.err.strip().splitlines()[-1][:200]
    ok = "no longer holds it" in res.err and (d / "tiny.retrieval.trials.jsonl").exists()
    return (CORRECT, "") if ok else (WRONG, "the stale lock was not taken over with a warning")


@case("locks/lock-held-by-a-running-process")
def _lock_held(work: Work) -> tuple[str, str]:
    d = work.dir("lock-held")
    lock = d / "tiny.retrieval.trials.jsonl.lock"
    code = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nos.write(fd, f'{os.getpid()}'.encode())\nprint('held', flush=True)\n"
            "time.sleep(600)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        holder.stdout.readline()
        (d / "tiny.retrieval.trials.jsonl").write_text(
            '{"format": "headprobe.trials", "version": 1, "settings": {}}\n')
        res = cli(*_tiny_profile_argv(work, d), "--resume")
        return judge(res, "refuse", message=f"in use by process {holder.pid}")
    finally:
        holder.kill()
        holder.wait()


@case("locks/two-resumes-of-one-log")
def _two_resumes(work: Work) -> tuple[str, str]:
    d = work.dir("two-resumes")
    log = _tiny_log(work)
    shutil.copy(log, d / log.name)
    a = start(*_tiny_profile_argv(work, d), "--resume", "--batch-size", 1)
    time.sleep(1.0)
    b = start(*_tiny_profile_argv(work, d), "--resume", "--batch-size", 1)
    ra, rb = finish(a), finish(b)
    if ra.crashed or rb.crashed:
        return TRACEBACK, "a resume crashed"
    records = [json.loads(x)["trial"] for x in (d / log.name).read_text().splitlines()[1:]]
    if len(records) != len(set(records)):
        return LOST, "a trial was logged twice"
    in_use = [r for r in (ra, rb) if any("in use by" in e for e in r.errors)]
    return (CLEAN, in_use[0].errors[0]) if in_use else (CORRECT, "")


# -- damaged models, a Hub that fails --

@case("models/truncated-safetensors")
def _truncated(work: Work) -> tuple[str, str]:
    d = work.dir("truncated")
    folder = shutil.copytree(work.tiny(), d / "m")
    weights = Path(folder) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return judge(cli("generate", "--model", folder, "--device", "cpu", "hi"), "refuse", message="cannot load")


@case("models/truncated-safetensors-profile-leaves-no-folder")
def _truncated_profile(work: Work) -> tuple[str, str]:
    d = work.dir("truncated-profile")
    folder = shutil.copytree(work.tiny(), d / "m")
    weights = Path(folder) / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    return judge(cli("profile", "--model", folder, "--lengths", 300, "--out-dir", d / "new" / "out"), "refuse",
                 absent=[d / "new"])


@case("models/config-only-folder")
def _config_only(work: Work) -> tuple[str, str]:
    d = work.dir("config-only")
    shutil.copy(work.tiny() / "config.json", d / "config.json")
    return judge(cli("generate", "--model", d, "hi"), "refuse", message="no weights")


@case("models/hub-answers-503")
def _hub_503(work: Work) -> tuple[str, str]:
    import http.server
    import threading

    class Hub(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}", "HF_HUB_OFFLINE": "0",
               "TRANSFORMERS_OFFLINE": "0", "HF_HOME": str(work.dir("hub-home"))}
        began = time.monotonic()
        res = sub("generate", "--model", "mistral-7b", "--device", "cpu", "hi", env=env, timeout=300)
        took = time.monotonic() - began
    finally:
        server.shutdown()
        server.server_close()
    verdict = judge(res, "refuse", message="Hugging Face Hub")
    if verdict[0] == CLEAN and took > 30:
        return MESSY, f"one line, but after {took:.0f} s of retries"
    return verdict


# ---- main -----------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a new one under /tmp)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument("--only", action="append", default=[], help="run the cases matching this glob (repeatable)")
    parser.add_argument("--skip", action="append", default=[], help="leave out the cases matching this glob")
    parser.add_argument("--fast", action="store_true", help="leave out the cases that run SmolLM2")
    parser.add_argument("--list", action="store_true", help="list the cases and stop")
    parser.add_argument("--verbose", action="store_true", help="print every case, not only the failures")
    parser.add_argument("--no-mounts", action="store_true",
                        help="mount no tmpfs: a file-size limit stands for the full disk, mode 0555 for a read-only "
                             "folder (which does not stop root)")
    args = parser.parse_args(argv)
    chosen = [c for c in CASES if (not args.only or any(fnmatch.fnmatch(c.name, p) for p in args.only))
              and not any(fnmatch.fnmatch(c.name, p) for p in args.skip) and not (args.fast and c.slow)]
    if args.list:
        print("\n".join(c.name for c in chosen))
        print(f"{len(chosen)} cases")
        return 0
    root = args.work or Path(tempfile.mkdtemp(prefix="headprobe-adversarial."))
    root.mkdir(parents=True, exist_ok=True)
    os.environ["HEADPROBE_DATA"] = str(root / "data")
    work = Work(root, args.fast, args.no_mounts)
    counts: Counter = Counter()
    began = time.monotonic()
    try:
        for i, c in enumerate(chosen, 1):
            t0 = time.monotonic()
            try:
                verdict, detail = c.run(work)
            except Exception:   # noqa: BLE001  (a broken case is reported, the run goes on)
                verdict, detail = "case error", traceback.format_exc().strip().splitlines()[-1]
            counts[verdict] += 1
            if args.verbose or verdict not in (CLEAN, CORRECT):
                detail = " | ".join(x.strip() for x in str(detail).splitlines() if x.strip())[:400]
                print(f"[{i}/{len(chosen)}] {verdict:<15} {c.name} ({time.monotonic() - t0:.1f} s): {detail}",
                      flush=True)
    finally:
        for mount in reversed(work.mounts):
            subprocess.run(["umount", "-l", str(mount)], capture_output=True, check=False)
        for p in root.rglob("*"):
            if p.is_dir() and not p.is_symlink():
                with contextlib.suppress(OSError):
                    p.chmod(0o755)
        if not args.keep and args.work is None:
            shutil.rmtree(root, ignore_errors=True)
    wall = time.monotonic() - began
    print()
    how = "tmpfs mounts" if work.mounts else "no mounts: file-size limits and folders without write permission"
    print(f"{len(chosen)} cases in {wall / 60:.1f} min ({how})")
    for verdict in (*ORDER, "case error"):
        if counts[verdict] or verdict in ORDER:
            print(f"  {verdict:<16} {counts[verdict]}")
    return 0 if counts[TRACEBACK] + counts[WRONG] + counts[LOST] + counts["case error"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
