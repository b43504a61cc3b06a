"""``headprobe profile``: run the needle and layer-retention probes on a model and write profiles."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import headprobe

from .common_args import (
    add_loading_arguments,
    add_prompt_format_arguments,
    add_rerun_arguments,
    chat_template_wanted,
    load_model,
    rank_note,
    rank_progress,
    resolve_prompt_format,
)
from .progress import tqdm_progress

#: Library parameters (of ProfileRequest) whose flags are spelled differently.
FLAGS = {"probes": "--probe", "needle_ids": "--needles", "needle_files": "--needle-file"}


def register(sub, formatter) -> None:
    p = sub.add_parser(
        "profile", formatter_class=formatter,
        help="profile retrieval, retrieval-reasoning heads and layer retention",
        description="Run needle-in-a-haystack probes (retrieval, enhanced retrieval, retrieval-reasoning heads) "
                    "and the layer-retention analysis; write profile JSON and trial logs.",
        epilog="examples:\n"
               "  headprobe profile                                  # embedded SmolLM2, CPU grid, all probes\n"
               "  headprobe profile --model mistral-7b               # HeadKV grid on a GPU\n"
               "  headprobe profile --probe retrieval_reasoning --lengths 1000 2000 4000 --depths 0 50 100\n"
               "  headprobe profile --grid full --mode reuse --until-stable   # approximate, stops when stable\n"
               "  headprobe profile --shard 0/4 ... ; headprobe profile --merge out/*.shard*.trials.jsonl\n"
               "  torchrun --standalone --nproc-per-node 4 -m headprobe profile ...   # 4 ranks, merged (docs/scale.md)",
    )
    add_loading_arguments(p)
    p.add_argument("--probe", nargs="+", default=["all"], metavar="KIND",
                   help=f"probes to run: all or any of {', '.join(headprobe.PROFILE_KINDS)} (one profile each)")
    p.add_argument("--mode", choices=list(headprobe.MODES), default="fast",
                   help="fast: teacher-forced, shared prefixes, batched; reference: greedy decoding step by step; "
                        "reuse: approximate, one haystack forward per length, a share of it recomputed per trial")
    p.add_argument("--recompute-share", type=float, default=100 * headprobe.DEFAULT_RECOMPUTE_SHARE, metavar="PCT",
                   help="reuse mode: percent of the haystack after the needle recomputed per trial (100 = exact)")
    p.add_argument("--until-stable", action="store_true",
                   help="run trials in an order spread over lengths, depths and needles; stop each needle pass "
                        "when its top-k heads are stable across bootstrap resamples")
    p.add_argument("--stable-k", type=int, default=20, metavar="K", help="--until-stable: size of the top head set")
    p.add_argument("--stable-jaccard", type=float, default=0.9, metavar="J",
                   help="--until-stable: least mean Jaccard index of the resampled top-k sets")
    p.add_argument("--plot-stability", action="store_true",
                   help="also write <name>.<kind>.stability.png: top heads with bootstrap intervals and the "
                        "top-k stability as trials were added")
    p.add_argument("--grid", choices=["auto", "cpu", "full"], default="auto",
                   help="default lengths/depths: full = HeadKV's 5 lengths up to 10K x 10 depths; auto = full on GPU")
    p.add_argument("--lengths", nargs="+", type=int, help="prompt lengths in model tokens (overrides --grid)")
    p.add_argument("--depths", nargs="+", type=float, help="needle depths in percent 0-100 (overrides --grid)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0], help="haystack seeds (document order)")
    p.add_argument("--needles", nargs="+", metavar="ID", help="only these needle ids")
    p.add_argument("--needle-file", action="append", default=[], metavar="FILE",
                   help="your own needle file (JSONL), repeatable: each needle's kind decides which probe uses "
                        "it; a kind no file holds uses the shipped needles")
    p.add_argument("--haystack", help="text file or folder of .txt files (default: the shipped corpus)")
    p.add_argument("--tasks", nargs="+", help="layer-retention task types (default: all shipped)")
    p.add_argument("--samples-per-task", type=int, help="layer-retention prompts per task")
    p.add_argument("--retention-max-tokens", type=int, default=2048, help="layer-retention prompt length cap")
    p.add_argument("--gate", choices=["auto", "published", "likelihood"], default="auto",
                   help="retrieval-reasoning gate: QA-F1 > 0.5 (published), correct candidate more likely than "
                        "the distractor (likelihood), or auto: likelihood for models under 1B parameters, "
                        "published for larger ones")
    p.add_argument("--group-reduction", choices=["mean", "max", "sum"], default="mean",
                   help="how query-head scores reduce to KV heads")
    p.add_argument("--batch-size", type=int, default=4, help="trials per forward in fast mode")
    p.add_argument("--out-dir", default=None,
                   help="where profiles and trial logs go (default: the user's profiles folder, "
                        "$HEADPROBE_DATA/profiles or ~/.local/share/headprobe/profiles, where allocate and eval "
                        "look first; never the shipped profiles)")
    p.add_argument("--name", help="file-name stem (default: the model alias)")
    add_prompt_format_arguments(p)
    add_rerun_arguments(p, log="its trial logs", replaced="existing trial logs and profiles")
    p.add_argument("--shard", help="run slice i of n of the trial grid (i/n); merge the logs with --merge")
    p.add_argument("--merge", nargs="+", metavar="LOG", help="merge shard trial logs into profiles and exit")
    p.add_argument("--allow-partial", action="store_true",
                   help="--merge: write profiles even when trials of the grid are missing from the logs")
    p.set_defaults(func=run)


def _pass_of(kind: str) -> str:
    return "reasoning" if kind == "retrieval_reasoning" else "retrieval"


def run(args) -> int:
    out_dir = Path(args.out_dir) if args.out_dir else headprobe.user_profiles_dir()
    if args.merge:
        for path in headprobe.merge_profile_logs(args.merge, out_dir, args.name, force=args.force,
                                                 allow_partial=args.allow_partial):
            print(f"wrote {path}")
        return 0
    with headprobe.process_group(args.device) as ranks:     # one process unless started by torchrun
        return _profile(args, ranks, out_dir)


def _profile(args, ranks, out_dir: Path) -> int:
    grids = headprobe.probe_grid
    probes = list(headprobe.PROBES) if "all" in args.probe else args.probe
    for probe in probes:
        if probe not in headprobe.PROBES:
            raise headprobe.HeadprobeError(f"--probe {probe}: expected all or one of "
                                           f"{', '.join(headprobe.PROBES)}")
    if args.batch_size < 1:
        raise headprobe.HeadprobeError("--batch-size: expected a positive integer")
    shard = grids.parse_shard(args.shard)
    share = headprobe.parse_recompute_share(args.recompute_share)
    until_stable = (headprobe.StopRule(k=args.stable_k, jaccard=args.stable_jaccard) if args.until_stable else None)
    ranks.check_shard(shard)
    needle_files = [Path(p) for p in args.needle_file]
    headprobe.check_needle_files(needle_files, headprobe.needle_kinds(probes))   # before the model loads
    if args.haystack is not None:
        headprobe.load_haystack(args.haystack)
    # The grid's defaults depend on the device; the CPU grid stands in until the model is loaded.
    lengths, depths, _ = grids.default_grid(False, None)
    if args.lengths:
        lengths = args.lengths
    if args.depths:
        depths = grids.parse_depths(args.depths)
    request = headprobe.ProfileRequest(
        probes=probes, lengths=list(lengths), depths=list(depths), out_dir=out_dir, mode=args.mode,
        seeds=args.seeds, needle_files=needle_files, needle_ids=args.needles, haystack=args.haystack,
        chat_template=chat_template_wanted(args), batch_size=args.batch_size, gate=args.gate,
        group_reduction=args.group_reduction, tasks=args.tasks, samples_per_task=args.samples_per_task,
        retention=headprobe.RetentionConfig(max_tokens=args.retention_max_tokens),
        resume=args.resume, force=args.force, shard=shard, name=args.name, recompute_share=share,
        until_stable=until_stable,
    )
    # What would be replaced, and whether the outputs can be written, is settled before the model loads.
    headprobe.check_profile_run_on_ranks(request, headprobe.resolve_model(args.model).name, ranks)
    loaded = load_model(args, ranks)
    resolve_prompt_format(args, loaded.tokenizer)
    on_gpu = loaded.device.type == "cuda"
    if args.grid == "full" or (args.grid == "auto" and on_gpu):
        grid_lengths, grid_depths, described = grids.full_grid(loaded.identity.max_context)
    else:
        grid_lengths, grid_depths, described = grids.default_grid(False, loaded.identity.max_context)
    if args.lengths:
        described = "custom lengths"
    else:
        request.lengths = list(grid_lengths)
    if args.depths:
        described += ", custom depths"
    else:
        request.depths = list(grid_depths)
    lengths, depths = request.lengths, request.depths
    where = f"{loaded.device}" + (f", {ranks.world_size} ranks ({ranks.backend})" if ranks.distributed else "")
    if ranks.is_main:
        mode = (f"reuse mode, recompute share {args.recompute_share:g}%" if args.mode == "reuse"
                else f"{args.mode} mode")
        if until_stable:
            mode += f", until the top-{until_stable.k} heads are stable"
        print(f"profiling {loaded.identity.name} on {where} ({mode}): {described}; "
              f"lengths {', '.join(map(str, lengths))}; depths {', '.join(f'{d * 100:g}%' for d in depths)}; "
              f"writing to {out_dir}", file=sys.stderr)
        if "reasoning" in headprobe.needle_kinds(probes):
            print(f"retrieval-reasoning gate: {headprobe.choose_gate(args.gate, loaded).describe()}",
                  file=sys.stderr)
    started = time.perf_counter()
    result = headprobe.run_profile_on_ranks(loaded, request, ranks, progress=rank_progress(ranks, tqdm_progress),
                                            version=headprobe.__version__)
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
    for path in result.profiles:
        profile = headprobe.Profile.load(path)
        t = profile.trials
        gate = f" the {t['gate']} gate" if t.get("gate") else ""
        print(f"wrote {path} ({t['passed']}/{t['total']} trials passed{gate})")
        if args.plot_stability and profile.intervals:
            log = next((lp for lp in result.logs if headprobe.read_log(lp)[0].get("pass") == _pass_of(profile.kind)),
                       None)
            fig = headprobe.stability_figure(profile, log=headprobe.read_log(log) if log else None)
            print(f"wrote {headprobe.save_figure(fig, path.with_suffix('.stability.png'), force=args.force)}")
    if result.failures:
        raise headprobe.NoPassingTrialsError("; ".join(result.failures))
    return 0
