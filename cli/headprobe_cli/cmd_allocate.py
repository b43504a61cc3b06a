"""``headprobe allocate``: turn profiles into a budget map."""

from __future__ import annotations

from pathlib import Path

import headprobe as hp


def register(sub, formatter) -> None:
    p = sub.add_parser(
        "allocate", help="turn profiles into per-head KV-cache budgets", formatter_class=formatter,
        description="Allocate KV-cache budgets per (layer, KV head) from head-score and/or layer-retention "
                    "profiles. Without --profile, the newest retrieval_reasoning profile of the model is used "
                    "(./profiles first, then the shipped ones).",
        epilog="examples:\n  headprobe allocate --beta 1.01\n"
               "  headprobe allocate --method combined --profile r2.json --profile layers.json --task code\n"
               "  headprobe allocate --profile llama3_r2.json --compat headkv --beta 1.5")
    p.add_argument("--model", default=None, help=f"alias, HF id or folder (default: {hp.DEFAULT_MODEL}, or the "
                   "model of --profile)")
    p.add_argument("--profile", action="append", default=[], metavar="FILE",
                   help="profile file (repeat for combined: head scores and layer retention)")
    p.add_argument("--method", default="headkv", help="headkv, dynamickv, combined, uniform or pyramid")
    p.add_argument("--beta", type=float, default=None, help="HeadKV β > 1 (default 1.2); PyramidKV's (default 20)")
    p.add_argument("--capacity", type=int, default=128, help="average tokens per KV head, window included")
    p.add_argument("--ratio", type=float, default=None, help="capacity as a share of --prompt-len instead")
    p.add_argument("--prompt-len", type=int, default=None, help="prompt length for --ratio and --clamp")
    p.add_argument("--clamp", action="store_true", help="clamp budgets to --prompt-len, redistributing the excess")
    p.add_argument("--window", type=int, default=8, help="last prompt tokens every head keeps")
    p.add_argument("--sink", type=int, default=0, help="first prompt tokens every head keeps")
    p.add_argument("--temperature", type=float, default=None, help="score temperature (>1 flattens, <1 sharpens)")
    p.add_argument("--reduction", default=None, help="query→KV head reduction: mean, max or sum "
                   "(default: the profile's)")
    p.add_argument("--task", default=None, help="layer-retention task, or a mix like qa:0.7,code:0.3 "
                   "(default: equal mix of all tasks)")
    p.add_argument("--compat", default=None, choices=["headkv"], help="reproduce HeadKV's arithmetic exactly "
                   "(query-head granularity, no clamp)")
    p.add_argument("--fallback-uniform", action="store_true",
                   help="allocate uniformly when the profile's scores are all zero or NaN (default: refuse)")
    p.add_argument("-o", "--output", default=None, help="budget file (default: budgets/<model>.<method>….json)")
    p.add_argument("--force", action="store_true", help="overwrite an existing output")
    p.set_defaults(func=run)


def run(args) -> int:
    from headprobe.allocation import allocate, load_profile, newest_profile, parse_task_mix, summarize
    from headprobe.interop import identity_for_model

    profiles = [load_profile(p) for p in args.profile]
    paths = list(args.profile)
    model = None
    if args.model is not None or not profiles:
        name = args.model or hp.DEFAULT_MODEL
        model = identity_for_model(name)
        if model is None and (profiles or args.method in ("uniform", "pyramid")):
            raise hp.HeadprobeError(f"--model {name}: cannot read its config (offline?); "
                                    "omit --model to use the profile's model")
        if not profiles and args.method in ("headkv", "combined"):
            found = newest_profile(model if model is not None else hp.resolve_model(name).name)
            profiles, paths = [found.profile], [str(found.path)]
            print(f"profile: {found.path}")
            if args.method == "combined":
                lay = newest_profile(found.profile.model, kind="layer_retention")
                profiles.append(lay.profile)
                paths.append(str(lay.path))
                print(f"profile: {lay.path}")
        elif not profiles and args.method == "dynamickv":
            found = newest_profile(model if model is not None else hp.resolve_model(name).name,
                                   kind="layer_retention")
            profiles, paths = [found.profile], [str(found.path)]
            print(f"profile: {found.path}")
        if model is None:
            model = profiles[0].model
    bm = allocate(args.method, profiles, model, capacity=args.capacity, window=args.window, sink=args.sink,
                  beta=args.beta, ratio=args.ratio, prompt_len=args.prompt_len, temperature=args.temperature,
                  reduction=args.reduction, task=parse_task_mix(args.task), compat=args.compat, clamp=args.clamp,
                  allow_fallback=args.fallback_uniform, source_paths=paths)
    out = args.output
    if out is None:
        m = bm.method
        parts = [hp.model_slug(bm.model.name), m["allocator"] + (f"-{m['compat']}" if m.get("compat") else ""),
                 f"cap{m['capacity']}"] + ([f"beta{m['beta']:g}"] if m.get("beta") is not None else [])
        out = Path("budgets") / (".".join(parts) + ".json")
    hp.check_overwrite(out, args.force)
    bm.save(out)
    print(summarize(bm))
    print(f"wrote {out}")
    return 0
