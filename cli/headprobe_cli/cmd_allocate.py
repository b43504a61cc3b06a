"""``headprobe allocate``: turn profiles into a budget map."""

from __future__ import annotations

from pathlib import Path

import headprobe as hp

from .common_args import add_force_argument, add_model_argument

#: Library parameters whose flags are spelled differently.
FLAGS = {"allow_fallback": "--fallback-uniform"}


def register(sub, formatter) -> None:
    p = sub.add_parser(
        "allocate", help="turn profiles into per-head KV-cache budgets", formatter_class=formatter,
        description="Allocate KV-cache budgets per (layer, KV head) from head-score and/or layer-retention "
                    "profiles. Without --profile, the newest profiles of the kinds the method reads are used "
                    "(the user's profiles folder, where `headprobe profile` writes, then ./profiles, then the shipped ones).\n\nmethods:\n"
                    + "\n".join(f"  {a.name:<10} {a.description}" for a in hp.ALLOCATORS.values()),
        epilog="examples:\n  headprobe allocate --beta 1.01\n"
               "  headprobe allocate --method combined --profile r2.json --profile layers.json --task code\n"
               "  headprobe allocate --profile llama3_r2.json --compat headkv --beta 1.5")
    add_model_argument(p, default=None, help=f"alias, HF id or folder (default: {hp.DEFAULT_MODEL}, or the "
                       "model of --profile)")
    p.add_argument("--profile", action="append", default=[], metavar="FILE",
                   help="profile file (repeat for combined: head scores and layer retention)")
    p.add_argument("--method", default="headkv", help=f"{', '.join(hp.ALLOCATORS)} (see the methods above)")
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
    add_force_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    profiles = [hp.load_profile(p) for p in args.profile]
    paths = list(args.profile)
    allocator = hp.ALLOCATORS.get(args.method)   # an unknown method is refused by allocate, in one line
    needs = allocator.needs if allocator is not None else ()
    model = None
    if args.model is not None or not profiles:
        name = args.model or hp.DEFAULT_MODEL
        model = hp.identity_for_model(name)
        if model is None and (profiles or not needs):
            raise hp.HeadprobeError(f"--model {name}: its config is not in the local Hugging Face cache and "
                                    "cannot be downloaded (offline?); omit --model to use the profile's model")
        if not profiles:
            for found in hp.profiles_for_method(args.method, model if model is not None else
                                                hp.resolve_model(name).name):
                profiles.append(found.profile)
                paths.append(str(found.path))
                print(f"profile: {found.path}")
        if model is None:
            model = profiles[0].model
    bm = hp.allocate(args.method, profiles, model, capacity=args.capacity, window=args.window, sink=args.sink,
                     beta=args.beta, ratio=args.ratio, prompt_len=args.prompt_len, temperature=args.temperature,
                     reduction=args.reduction, task=hp.parse_task_mix(args.task), compat=args.compat,
                     clamp=args.clamp, allow_fallback=args.fallback_uniform, source_paths=paths)
    out = args.output
    if out is None:
        m = bm.method
        parts = [hp.model_slug(bm.model.name), m["allocator"] + (f"-{m['compat']}" if m.get("compat") else ""),
                 f"cap{m['capacity']}"] + ([f"beta{m['beta']:g}"] if m.get("beta") is not None else [])
        out = Path("budgets") / (".".join(parts) + ".json")
    hp.check_overwrite(out, args.force)
    bm.save(out)
    print(hp.summarize(bm))
    print(f"wrote {out}")
    return 0
