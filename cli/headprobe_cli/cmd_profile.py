"""``headprobe profile``: run the needle and layer-retention probes on a model and write profiles."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import headprobe
from headprobe.errors import HeadprobeError, NoPassingTrialsError
from headprobe.files.trial_log import read_log
from headprobe.models.loading import resolve_model
from headprobe.paths import user_profiles_dir
from headprobe.probes import trial_grid
from headprobe.probes.early_stop import StopRule
from headprobe.probes.inputs import needle_kinds
from headprobe.probes.modes import DEFAULT_RECOMPUTE_SHARE, MODES, parse_recompute_share
from headprobe.probes.registry import PROBES
from headprobe.profile import Profile
from headprobe.profile_kinds import PROFILE_KINDS

from .common_args import (
    LazyChoices,
    _Unset,
    add_loading_arguments,
    add_prompt_format_arguments,
    add_rerun_arguments,
    chat_template_wanted,
    load_model,
    rank_note,
    rank_progress,
    resolve_prompt_format,
    unset,
)
from .profile_summary import summary_lines
from .progress import tqdm_progress

if TYPE_CHECKING:
    from headprobe.models.loading import LoadedModel

#: Library parameters (of ProfileRequest) whose flags are spelled differently.
FLAGS = {"probes": "--probe", "needle_ids": "--needles", "needle_files": "--needle-file", "options": "--pass-option",
         "retention": "--retention-max-tokens",
         "contexts": "--contexts", "fields": "--fields"}

#: Flags whose request parameter is named differently: flag destination → ProfileRequest parameter.
PARAMETERS = {"needles": "needle_ids", "retention_max_tokens": "retention"}
#: What ``--merge`` reads besides the logs; every other flag is refused with it.
MERGE_FLAGS = {"merge", "out_dir", "name", "force", "allow_partial"}
#: Flags that need another: flag destination → (the flag it needs, that flag's destination).
NEEDS_FLAG = {"stable_k": ("--until-stable", "until_stable"), "stable_jaccard": ("--until-stable", "until_stable"),
              "allow_partial": ("--merge", "merge")}


def given(args, dest: str) -> bool:
    """Whether the flag of ``dest`` was typed: a value other than its default (``None``, ``False``, an empty
    list, an :func:`unset` default or the parser's)."""
    value = getattr(args, dest, None)
    if isinstance(value, _Unset) or value is None or value is False or value == []:
        return False
    default = args.profile_defaults.get(dest)
    return isinstance(default, _Unset) or value != default


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = (
        "Run needle-in-a-haystack probes (retrieval, enhanced retrieval, retrieval-reasoning heads) "
        "and the layer-retention analysis; write profile JSON and trial logs."
    )
    p.epilog = (
        "examples:\n"
        "  headprobe profile                                  # embedded SmolLM2, CPU grid, all probes\n"
        "  headprobe profile --model mistral-7b               # HeadKV grid on a GPU\n"
        "  headprobe profile --probe retrieval_reasoning --lengths 1000 2000 4000 --depths 0 50 100\n"
        "  headprobe profile --grid full --mode reuse --until-stable   # approximate, stops when stable\n"
        "  headprobe profile --contexts qa.jsonl --fields context=doc,question=q,answer=a   # your own data\n"
        "  headprobe profile --shard 0/4 ... ; headprobe profile --merge out/*.shard*.trials.jsonl\n"
        "  torchrun --standalone --nproc-per-node 4 -m headprobe profile ...   # 4 ranks, merged (docs/scale.md)"
    )
    add_loading_arguments(p)
    _add_probe_arguments(p)
    _add_trial_arguments(p)
    p.add_argument("--gate", choices=["auto", "published", "likelihood"], default=unset("auto"),
                   help="retrieval-reasoning gate: QA-F1 > 0.5 (published), correct candidate more likely than "
                        "the distractor (likelihood), or auto: likelihood for models under 1B parameters, "
                        "published for larger ones")
    p.add_argument("--group-reduction", choices=["mean", "max", "sum"], default=unset("mean"),
                   help="how query-head scores reduce to KV heads")
    p.add_argument("--batch-size", type=int, default=unset(4), help="trials per forward in fast mode")
    p.add_argument("--out-dir", default=None,
                   help="where profiles and trial logs go (default: the user's profiles folder, "
                        "$HEADPROBE_DATA/profiles or ~/.local/share/headprobe/profiles, where allocate and eval "
                        "look first; never the shipped profiles)")
    p.add_argument("--name", help="file-name stem (default: the model alias)")
    add_prompt_format_arguments(p)
    p.add_argument("--pass-option", action="append", default=[], metavar="PASS.FIELD=VALUE",
                   help="an option of a probe pass that declares its own (repeatable)")
    add_rerun_arguments(p, log="its trial logs", replaced="existing trial logs and profiles")
    p.add_argument("--shard", help="run slice i of n of the trial grid (i/n); merge the logs with --merge")
    p.add_argument("--merge", nargs="+", metavar="LOG",
                   help="merge shard trial logs into profiles and exit (with --out-dir, --name, --force, --allow-partial)")
    p.add_argument("--allow-partial", action="store_true",
                   help="--merge: write profiles even when trials of the grid are missing from the logs")
    p.set_defaults(func=run)
    p.set_defaults(profile_defaults={a.dest: a.default for a in p._actions})


def _add_probe_arguments(p) -> None:
    """Which probes run, in which mode, and when a needle pass may stop early."""
    p.add_argument("--probe", nargs="+", default=["all"], metavar="KIND",
                   choices=LazyChoices(lambda: ["all", *PROBES]),
                   help=f"probes to run: all or any of {', '.join(PROFILE_KINDS)} (one profile each)")
    p.add_argument("--mode", choices=[*MODES, "auto"], default="auto",
                   help="fast: teacher-forced, shared prefixes, batched; reference: greedy decoding step by step; "
                        "reuse: approximate, one haystack forward per length, a share of it recomputed per trial; "
                        "auto: reuse mode at a 0%% share on a CPU (measured close to exact, docs/benchmarks.md), "
                        "fast mode on a GPU or where a probe or the model does not run in reuse mode")
    p.add_argument("--recompute-share", type=float, default=unset(100 * DEFAULT_RECOMPUTE_SHARE),
                   metavar="PCT",
                   help="reuse mode: percent of the haystack after the needle recomputed per trial (100 = exact)")
    p.add_argument("--until-stable", action="store_true",
                   help="run trials in an order spread over lengths, depths and needles; stop each needle pass "
                        "when its top-k heads are stable across bootstrap resamples")
    p.add_argument("--stable-k", type=int, default=unset(20), metavar="K", help="--until-stable: size of the top head set")
    p.add_argument("--stable-jaccard", type=float, default=unset(0.9), metavar="J",
                   help="--until-stable: least mean Jaccard index of the resampled top-k sets")
    p.add_argument("--plot-stability", action="store_true",
                   help="also write <name>.<kind>.stability.png: top heads with bootstrap intervals and the "
                        "top-k stability as trials were added")


def _add_trial_arguments(p) -> None:
    """The trial grid (lengths, depths, seeds) and what the trials read (needles, haystack, contexts,
    layer-retention tasks)."""
    p.add_argument("--grid", choices=list(trial_grid.GRIDS), default=unset("auto"),
                   help="default lengths/depths: full = HeadKV's 5 lengths up to 10K x 10 depths; auto = full on GPU")
    p.add_argument("--lengths", nargs="+", type=int, help="prompt lengths in model tokens (overrides --grid)")
    p.add_argument("--depths", nargs="+", type=float, help="needle depths in percent 0-100 (overrides --grid)")
    p.add_argument("--seeds", nargs="+", type=int, default=unset([0]), help="haystack seeds (document order)")
    p.add_argument("--needles", nargs="+", metavar="ID", help="only these needle ids")
    p.add_argument("--needle-file", action="append", default=[], metavar="FILE",
                   help="your own needle file (JSONL), repeatable: each needle's kind decides which probe uses "
                        "it; a kind no file holds uses the shipped needles")
    p.add_argument("--haystack", help="text file or folder of .txt files (default: the shipped corpus)")
    p.add_argument("--contexts", metavar="FILE",
                   help="your own examples (JSONL/JSON/CSV/Parquet or a dataset folder), each a context, a question "
                        "and an answer found in the context: profiles context_retrieval, context_enhanced_retrieval "
                        "and query_focus (what --probe all means with this flag)")
    p.add_argument("--fields", metavar="ROLE=NAME,...",
                   help="--contexts: field names, e.g. context=document,question=query,answer=answer"
                        "[,answer_offset=start][,id=key]; answers is another name of answer (default: context; question, "
                        "else input; answer, else answers)")
    p.add_argument("--split", metavar="NAME",
                   help="--contexts: the split of a folder holding several (default: its only split)")
    p.add_argument("--tasks", nargs="+", help="layer-retention task types (default: all shipped)")
    p.add_argument("--samples-per-task", type=int, help="layer-retention prompts per task")
    p.add_argument("--retention-max-tokens", type=int, default=unset(2048), help="layer-retention prompt length cap")


def run(args) -> int:
    _check_flags(args)
    out_dir = Path(args.out_dir) if args.out_dir else user_profiles_dir()
    if args.merge:
        return _merge(args, out_dir)
    return _profile_on_ranks(args, out_dir)


def _merge(args, out_dir: Path) -> int:
    """``--merge``: the shard trial logs merged into profiles."""
    # loads torch: imported when the command runs, not for --help
    from headprobe.probes.run import merge_profile_logs

    for path in merge_profile_logs(args.merge, out_dir, args.name, force=args.force,
                                   allow_partial=args.allow_partial):
        print(f"wrote {path}")
    return 0


def _profile_on_ranks(args, out_dir: Path) -> int:
    """The profile run, on every rank when started by torchrun."""
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.distributed.ranks import process_group

    with process_group(args.device) as ranks:     # one process unless started by torchrun
        return _profile(args, ranks, out_dir)


def _check_flags(args) -> None:
    """Refuse flags that would not take effect, naming the flag and what it needs: anything but
    ``--out-dir --name --force --allow-partial`` with ``--merge``, a flag without the one it needs
    (``--stable-k`` without ``--until-stable``), ``--plot-stability`` where no profile with intervals is
    written. Flags the request reads are checked by the library (``ProfileRequest.check_options``)."""
    if args.merge:
        extra = [d for d in args.profile_defaults if d not in MERGE_FLAGS and given(args, d)]
        if extra:
            raise HeadprobeError(f"{_flag(extra[0])}: does not apply to --merge, which takes the settings "
                                 "of the logs (it reads --out-dir, --name, --force and --allow-partial)")
    for dest, (flag, needed) in NEEDS_FLAG.items():
        if given(args, dest) and not given(args, needed):
            raise HeadprobeError(f"{_flag(dest)}: applies with {flag} only")
    if args.plot_stability:
        probes = list(PROBES) if "all" in args.probe else args.probe
        if not needle_kinds(probes):
            raise HeadprobeError(f"--plot-stability: draws the bootstrap intervals of head-score profiles; "
                                 f"none is requested (--probe {' '.join(args.probe)})")
        if args.shard:
            raise HeadprobeError(f"--plot-stability: a shard (--shard {args.shard}) writes no profile to "
                                 "draw; pass it to the run that writes the profiles")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _request(args, out_dir: Path):
    """The request the arguments make (its lengths and depths left to the grid unless given); its
    parameters that would not take effect are refused (``ProfileRequest.check_options`` with the flags typed)."""
    # loads torch: imported when the command runs, not for --help
    from headprobe.probes.request import ProfileRequest
    from headprobe.probes.retention import RetentionConfig

    until_stable = (StopRule(k=int(args.stable_k), jaccard=float(args.stable_jaccard))
                    if args.until_stable else None)
    probes = _probes(args)
    request = ProfileRequest(
        probes=probes, lengths=args.lengths,
        depths=trial_grid.parse_depths(args.depths) if args.depths else None, grid=str(args.grid),
        out_dir=out_dir,
        mode=args.mode, seeds=list(args.seeds), needle_files=[Path(p) for p in args.needle_file],
        needle_ids=args.needles, haystack=args.haystack, chat_template=chat_template_wanted(args),
        batch_size=int(args.batch_size), gate=str(args.gate), group_reduction=str(args.group_reduction),
        tasks=args.tasks, samples_per_task=args.samples_per_task,
        retention=RetentionConfig(max_tokens=int(args.retention_max_tokens)), resume=args.resume,
        force=args.force, shard=trial_grid.parse_shard(args.shard), name=args.name,
        recompute_share=parse_recompute_share(float(args.recompute_share)), until_stable=until_stable,
        options=_context_options(args, probes, _pass_options(args.pass_option)))
    request.check_options({PARAMETERS.get(d, d) for d in args.profile_defaults if given(args, d)})
    return request


def _probes(args) -> list[str]:
    """The probes asked for: ``all`` is every probe that reads the user's examples with ``--contexts``, every
    other probe without it."""
    # loads torch: imported when the command runs, not for --help
    from headprobe.probes.context_pass import context_probes

    if "all" in args.probe:
        readers = context_probes()
        return [k for k in PROBES if (k in readers) == bool(args.contexts)]
    return list(args.probe)


def _context_options(args, probes: list[str], options: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """``--contexts``, ``--fields`` and ``--split`` as the options of every requested pass that reads the user's
    examples."""
    # loads torch: imported when the command runs, not for --help
    from headprobe.probes.context_pass import context_probes

    kinds = context_probes()
    readers = list(dict.fromkeys(kinds[k] for k in probes if k in kinds))
    if args.contexts is None:
        for flag, value, what in (("--fields", args.fields, "names the fields"), ("--split", args.split, "picks a split")):
            if value is not None:
                raise HeadprobeError(f"{flag}: {what} of --contexts FILE, which was not given")
        for name in readers:
            if "file" not in options.get(name, {}):
                asked = [k for k in probes if kinds.get(k) == name]
                raise HeadprobeError(f"--probe {' '.join(asked)}: profiles your own examples; give "
                                     "--contexts FILE")
        return options
    if not readers:
        raise HeadprobeError(f"--contexts: none of the probes asked for reads it ({', '.join(probes)}); "
                             "leave --probe out or name context_retrieval, context_enhanced_retrieval "
                             "or query_focus")
    for name in readers:
        given = options.setdefault(name, {})
        given.setdefault("file", args.contexts)
        if args.fields is not None:
            given.setdefault("fields", args.fields)
        if args.split is not None:
            given.setdefault("split", args.split)
    return options


def _pass_options(items: list[str]) -> dict[str, dict[str, str]]:
    """``["examples.file=qa.jsonl"]`` → ``{"examples": {"file": "qa.jsonl"}}``."""
    options: dict[str, dict[str, str]] = {}
    for item in items:
        target, sep, value = item.partition("=")
        pass_name, dot, field = target.partition(".")
        if not (sep and dot and pass_name and field):
            raise HeadprobeError(f"--pass-option {item}: expected PASS.FIELD=VALUE")
        options.setdefault(pass_name, {})[field] = value
    return options


def _profile(args, ranks, out_dir: Path) -> int:
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.distributed.profile_ranks import check_profile_run_on_ranks, run_profile_on_ranks

    request = _request(args, out_dir)
    # Everything that can be checked without the model, and what would be replaced, is settled before it loads.
    plan = check_profile_run_on_ranks(request, resolve_model(args.model).name, ranks)
    lm = load_model(args, ranks)
    resolve_prompt_format(args, lm.tokenizer)
    run = plan.resolve(lm, version=headprobe.__version__)
    if ranks.is_main:
        _describe(args, run, lm, ranks, out_dir)
    started = time.perf_counter()
    result = run_profile_on_ranks(lm, run, ranks, progress=rank_progress(ranks, tqdm_progress))
    elapsed = time.perf_counter() - started
    if not ranks.is_main:
        rank_note(ranks, f"{result.trials_run} trials run, {result.trials_skipped} resumed, {elapsed:.0f} s; "
                         f"logs {', '.join(map(str, result.logs))}")
        return 0
    print(f"{result.trials_run} trials run, {result.trials_skipped} resumed from logs, {elapsed:.0f} s",
          file=sys.stderr)
    for path in result.logs:
        print(f"trial log {path}")
    for pass_name, outcome in result.stopping.items():
        state = "stable" if outcome.stable else "not stable when the grid ran out"
        print(f"{pass_name}: {state} after {outcome.trials} of {outcome.grid} trials", file=sys.stderr)
    logs: dict[str, Path] = {}
    for lp in result.logs:
        logs.setdefault(read_log(lp)[0].get("pass"), lp)
    for path in result.profiles:
        profile = Profile.load(path)
        t = profile.trials
        gate = f" the {t['gate']} gate" if t.get("gate") else ""
        left_out = (f"; {t['answer_not_in_context']} of {t['rows']} rows left out, their answer is not in their "
                    "context" if t.get("answer_not_in_context") else "")
        print(f"wrote {path} ({t['passed']}/{t['total']} trials passed{gate}{left_out})")
        if args.plot_stability and profile.intervals:
            log = logs.get(profile.probe.get("pass"))
            print(f"wrote {_stability_plot(profile, log, path.with_suffix('.stability.png'), args.force)}")
    for line in summary_lines(result.profiles, user_profiles_dir()):
        print(line)
    if result.failures:
        raise NoPassingTrialsError("; ".join(result.failures))
    return 0


def _stability_plot(profile: Profile, log: Path | None, out: Path, force: bool) -> Path:
    """``--plot-stability``: the profile's top heads with their intervals, and the stability as trials were
    added (from its trial log, when there is one)."""
    # loads matplotlib: imported when a figure is drawn, not for --help
    from headprobe.plots.profile_figures import save_figure
    from headprobe.plots.stability import stability_figure

    fig = stability_figure(profile, log=read_log(log) if log else None)
    return save_figure(fig, out, force=force)


def _describe(args, run, lm: LoadedModel, ranks, out_dir: Path) -> None:
    """The run's first lines: model, device, mode, grid, where it writes, and each pass's gate when chosen."""
    where = f"{lm.device}" + (f", {ranks.world_size} ranks ({ranks.backend})" if ranks.distributed else "")
    request = run.request
    mode = (f"reuse mode, recompute share {100 * request.recompute_share:g}%" if request.mode == "reuse"
            else f"{request.mode} mode")
    if args.mode == "auto":
        mode += ", chosen by --mode auto"
    if run.request.until_stable:
        mode += f", until the top-{run.request.until_stable.k} heads are stable"
    grid = run.grid
    contexts = [p.plan.data.data for p in run.passes if getattr(p.steps, "reads_contexts", False)]
    if contexts and len(contexts) == len(run.passes):
        what = "your examples"
    else:
        what = (f"{grid.description}; lengths {', '.join(map(str, grid.lengths))}; "
                f"depths {', '.join(f'{d * 100:g}%' for d in grid.depths)}")
    print(f"profiling {lm.identity.name} on {where} ({mode}): {what}; writing to {out_dir}", file=sys.stderr)
    if contexts:
        print(f"contexts {contexts[0].describe()}", file=sys.stderr)
    for pass_run in run.passes:
        if pass_run.gate is not None:
            print(f"{'/'.join(pass_run.plan.probes).replace('_', '-')} gate: {pass_run.gate.describe()}",
                  file=sys.stderr)
