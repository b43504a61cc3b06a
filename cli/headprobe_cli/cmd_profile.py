"""``headprobe profile``: run the needle and layer-retention probes on a model and write profiles."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import headprobe
from headprobe import PROBES, ProfileRequest, merge_profile_logs, run_profile
from headprobe import probe_grid as grids

from .progress import tqdm_progress

#: Library parameters whose flag is not ``--`` + the parameter name (errors spell them as these flags).
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
               "  headprobe profile --shard 0/4 ... ; headprobe profile --merge out/*.shard*.trials.jsonl",
    )
    p.add_argument("--model", default=headprobe.DEFAULT_MODEL, help="alias, Hugging Face id or local directory")
    p.add_argument("--probe", nargs="+", default=["all"], metavar="KIND",
                   help=f"probes to run: all or any of {', '.join(PROBES)}")
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
                   help="your own needle file (JSONL); its needles' kind decides which probe uses it")
    p.add_argument("--haystack", help="text file or folder of .txt files (default: the shipped corpus)")
    p.add_argument("--tasks", nargs="+", help="layer-retention task types (default: all shipped)")
    p.add_argument("--samples-per-task", type=int, help="layer-retention prompts per task")
    p.add_argument("--retention-max-tokens", type=int, default=2048, help="layer-retention prompt length cap")
    p.add_argument("--gate", choices=["published", "likelihood"], default="published",
                   help="retrieval-reasoning gate: QA-F1 > 0.5 (published) or correct candidate more likely")
    p.add_argument("--group-reduction", choices=["mean", "max", "sum"], default="mean",
                   help="how query-head scores reduce to KV heads")
    p.add_argument("--batch-size", type=int, default=4, help="trials per forward in fast mode")
    p.add_argument("--out-dir", default="profiles", help="where profiles and trial logs go")
    p.add_argument("--name", help="file-name stem (default: the model alias)")
    p.add_argument("--no-chat-template", action="store_true", help="do not apply the model's chat template")
    p.add_argument("--resume", action="store_true", help="continue an interrupted run from its trial logs")
    p.add_argument("--force", action="store_true", help="start over, replacing existing trial logs")
    p.add_argument("--shard", help="run slice i of n of the trial grid (i/n); merge the logs with --merge")
    p.add_argument("--merge", nargs="+", metavar="LOG", help="merge shard trial logs into profiles and exit")
    p.add_argument("--device", help="cpu, cuda, cuda:N or auto (device_map=auto); default: GPU if present")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--trust-remote-code", action="store_true", help="allow models that run their own code")
    p.set_defaults(func=run)


def _pass_of(kind: str) -> str:
    return "reasoning" if kind == "retrieval_reasoning" else "retrieval"


def run(args) -> int:
    if args.merge:
        for path in merge_profile_logs(args.merge, args.out_dir, args.name):
            print(f"wrote {path}")
        return 0
    probes = list(PROBES) if "all" in args.probe else args.probe
    for probe in probes:
        if probe not in PROBES:
            raise headprobe.HeadprobeError(f"--probe {probe}: expected all or one of {', '.join(PROBES)}")
    if args.batch_size < 1:
        raise headprobe.HeadprobeError("--batch-size: expected a positive integer")
    shard = grids.parse_shard(args.shard)
    share = headprobe.parse_recompute_share(args.recompute_share)
    until_stable = (headprobe.StopRule(k=args.stable_k, jaccard=args.stable_jaccard) if args.until_stable else None)
    loaded = headprobe.load_model(args.model, device=args.device, dtype=args.dtype,
                                  trust_remote_code=args.trust_remote_code)
    on_gpu = loaded.device.type == "cuda"
    if args.grid == "full" or (args.grid == "auto" and on_gpu):
        lengths, depths, described = grids.full_grid(loaded.identity.max_context)
    else:
        lengths, depths, described = grids.default_grid(False, loaded.identity.max_context)
    if args.lengths:
        lengths, described = args.lengths, "custom lengths"
    if args.depths:
        depths = grids.parse_depths(args.depths)
        described += ", custom depths"
    needle_files = {}
    for path in args.needle_file:
        kind = headprobe.load_needles(path)[0].kind
        needle_files[kind] = Path(path)
    request = ProfileRequest(
        probes=probes, lengths=list(lengths), depths=list(depths), out_dir=Path(args.out_dir), mode=args.mode,
        seeds=args.seeds, needle_files=needle_files, needle_ids=args.needles, haystack=args.haystack,
        chat_template=not args.no_chat_template, batch_size=args.batch_size, gate=args.gate,
        group_reduction=args.group_reduction, tasks=args.tasks, samples_per_task=args.samples_per_task,
        retention=headprobe.RetentionConfig(max_tokens=args.retention_max_tokens),
        resume=args.resume, force=args.force, shard=shard, name=args.name, recompute_share=share,
        until_stable=until_stable,
    )
    mode = f"reuse mode, recompute share {args.recompute_share:g}%" if args.mode == "reuse" else f"{args.mode} mode"
    if until_stable:
        mode += f", until the top-{until_stable.k} heads are stable"
    print(f"profiling {loaded.identity.name} on {loaded.device} ({mode}): {described}; "
          f"lengths {', '.join(map(str, lengths))}; depths {', '.join(f'{d * 100:g}%' for d in depths)}",
          file=sys.stderr)
    started = time.perf_counter()
    result = run_profile(loaded, request, progress=tqdm_progress, version=headprobe.__version__)
    elapsed = time.perf_counter() - started
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
        print(f"wrote {path} ({t['passed']}/{t['total']} trials passed)")
        if args.plot_stability and profile.intervals:
            log = next((lp for lp in result.logs if headprobe.read_log(lp)[0].get("pass") == _pass_of(profile.kind)),
                       None)
            fig = headprobe.stability_figure(profile, log=headprobe.read_log(log) if log else None)
            print(f"wrote {headprobe.save_figure(fig, path.with_suffix('.stability.png'), force=args.force)}")
    if result.failures:
        raise headprobe.NoPassingTrialsError("; ".join(result.failures))
    return 0
