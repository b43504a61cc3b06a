"""``headprobe allocate``: turn profiles into a budget map.

The option flags are made from the allocators' options dataclasses (:class:`headprobe.CapacityOptions`
and each method's ``Allocator.options``): a new option is a new field there, not a new flag here.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from headprobe.allocation.api import allocate, load_profile, profiles_for_method, summarize
from headprobe.allocation.options import CapacityOptions
from headprobe.allocation.registry import ALLOCATORS, check_allocator_options
from headprobe.budget_map import BudgetMap
from headprobe.errors import HeadprobeError
from headprobe.files.overwrite import check_overwrite
from headprobe.models.loading import resolve_model
from headprobe.models.registry import DEFAULT_MODEL, model_slug
from headprobe.tool_files.known import identity_for_model

from .common_args import add_force_argument, add_model_argument


def option_infos() -> dict[str, Any]:
    """Every method option by name (an ``OptionInfo``), over the registered methods, in their order."""
    out: dict[str, Any] = {}
    for allocator in ALLOCATORS.values():
        for info in allocator.options.infos():
            out.setdefault(info.name, info)
    return out


def _flags() -> dict[str, str]:
    """Library parameters whose flags are spelled differently (``allow_fallback`` → ``--fallback-uniform``)."""
    infos = [*CapacityOptions.infos(), *option_infos().values()]
    return {i.name: i.flag for i in infos if i.flag != "--" + i.name.replace("_", "-")}


FLAGS = _flags()


def _add_flag(p: argparse.ArgumentParser, info: Any, default: object, note: str = "") -> None:
    """One flag for one option: a switch for a bool, else a value of the option's type (and choices)."""
    text = (info.help + note).replace("%", "%%")           # argparse formats help with %
    if info.cli_type is bool:
        p.add_argument(info.flag, dest=info.name, action="store_true", default=default, help=text)
    else:
        p.add_argument(info.flag, dest=info.name, type=info.cli_type, default=default, choices=info.choices,
                       help=text)


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = (
        "Allocate KV-cache budgets per (layer, KV head) from head-score and/or layer-retention "
        "profiles. Without --profile, the newest profiles of the kinds the method reads are used "
        "(the user's profiles folder, where `headprobe profile` writes, then ./profiles, then the shipped ones).\n\nmethods:\n"
        + "\n".join(f"  {a.name:<10} {a.description}" for a in ALLOCATORS.values())
    )
    p.epilog = (
        "examples:\n  headprobe allocate --beta 1.01\n"
        "  headprobe allocate --method combined --profile r2.json --profile layers.json --task code\n"
        "  headprobe allocate --method pyramid --model smollm2-135m --taper 10\n"
        "  headprobe allocate --profile llama3_r2.json --compat headkv --beta 1.5"
    )
    add_model_argument(p, default=None, help=f"alias, HF id or folder (default: {DEFAULT_MODEL}, or the "
                       "model of --profile)")
    p.add_argument("--profile", action="append", default=[], metavar="FILE",
                   help="profile file (repeat for combined: head scores and layer retention)")
    p.add_argument("--method", default="headkv", help=f"{', '.join(ALLOCATORS)} (see the methods above)")
    for info in CapacityOptions.infos():
        _add_flag(p, info, info.default)
    group = p.add_argument_group("method options", "each read by the methods named after it; giving one the "
                                 "method does not read is refused")
    for info in option_infos().values():
        default = "" if info.default is None or info.cli_type is bool else f"; default {info.default:g}" \
            if isinstance(info.default, float) else f"; default {info.default}"
        readers = [a.name for a in ALLOCATORS.values() if info.name in a.options.names()]
        _add_flag(group, info, argparse.SUPPRESS, f" (methods: {', '.join(readers)}{default})")
    p.add_argument("-o", "--output", default=None, help="budget file (default: budgets/<model>.<method>….json)")
    add_force_argument(p)
    p.set_defaults(func=run)


def default_output(bm: BudgetMap) -> Path:
    """``budgets/<model>.<method>[-compat].cap<C>[.<option><value>...].json``, naming the options whose
    declaration gives a file-name prefix (HeadKV's β, PyramidKV's taper)."""
    m = bm.method
    parts = [model_slug(bm.model.name), m["allocator"] + (f"-{m['compat']}" if m.get("compat") else ""),
             f"cap{m['capacity']}"]
    allocator = ALLOCATORS.get(m["allocator"])
    for info in allocator.options.infos() if allocator is not None else ():
        if info.filename and m.get(info.record) is not None:
            parts.append(f"{info.filename}{m[info.record]:g}")
    return Path("budgets") / (".".join(parts) + ".json")


def run(args) -> int:
    allocator = ALLOCATORS.get(args.method)   # an unknown method is refused by allocate, in one line
    needs = allocator.needs if allocator is not None else ()
    given = {name: getattr(args, name) for name in option_infos() if hasattr(args, name)}
    if allocator is not None:       # an option the method does not read: refused before any file is read
        check_allocator_options(allocator, given)
    profiles = [load_profile(p) for p in args.profile]
    paths = list(args.profile)
    model = None
    if args.model is not None or not profiles:
        name = args.model or DEFAULT_MODEL
        model = identity_for_model(name)
        if model is None and (profiles or not needs):
            raise HeadprobeError(f"--model {name}: its config is not in the local Hugging Face cache and "
                                 "cannot be downloaded (offline?); omit --model to use the profile's model")
        if not profiles:
            for found in profiles_for_method(args.method, model if model is not None else
                                             resolve_model(name).name):
                profiles.append(found.profile)
                paths.append(str(found.path))
                print(f"profile: {found.path}")
        if model is None:
            model = profiles[0].model
    capacity = {name: getattr(args, name) for name in CapacityOptions.names()}
    bm = allocate(args.method, profiles, model, source_paths=paths, **capacity, **given)
    out = args.output if args.output is not None else default_output(bm)
    check_overwrite(out, args.force)
    bm.save(out, force=args.force)
    print(summarize(bm))
    print(f"wrote {out}")
    return 0
