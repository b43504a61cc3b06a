"""``headprobe import``: read other tools' head files as headprobe profiles."""

from __future__ import annotations

import argparse

from headprobe.files.overwrite import check_overwrite
from headprobe.models.registry import model_slug
from headprobe.paths import user_profiles_dir
from headprobe.profile_kinds import HEAD_SCORE_KINDS
from headprobe.tool_files.auto import IMPORT_FORMATS, import_file

from .common_args import add_force_argument, add_model_argument


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = (
        "Import a HeadKV / Retrieval_Head score JSON or a DuoAttention pattern folder as a "
        "headprobe profile. The model comes from the file name or --model."
    )
    p.epilog = (
        "examples:\n  headprobe import Meta-Llama-3-8B-Instruct_retrieval_reasoning_heads.json\n"
        "  headprobe import attn_patterns/Mistral-7B-Instruct-v0.2 --model mistral-7b"
    )
    p.add_argument("input", help="score JSON file, DuoAttention folder or its full_attention_heads.tsv")
    p.add_argument("--from", dest="fmt", default=None, choices=IMPORT_FORMATS,
                   help="input format (default: from the path)")
    add_model_argument(p, default=None, help="alias or HF id of the model (default: from the file name)")
    p.add_argument("--kind", default=None, choices=HEAD_SCORE_KINDS,
                   help="profile kind, any whose profiles hold head scores (default: from the file name)")
    p.add_argument("-o", "--output", default=None, help="profile file (default: <model>.<kind>.<source>.json in the "
                   "user's profiles folder, where allocate looks; see headprobe profile --help)")
    add_force_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    prof = import_file(args.input, args.fmt, args.model, args.kind)
    out = args.output
    if out is None:
        slug = model_slug(prof.model.name)
        out = user_profiles_dir() / f"{slug}.{prof.kind}.{prof.probe.get('source', 'imported')}.json"
    check_overwrite(out, args.force)
    prof.save(out, force=args.force)
    top = ", ".join(f"{l}-{h}" for l, h, _ in prof.top_heads(5))
    print(f"{prof.model.name}: {prof.kind} from {prof.probe.get('source')}, {prof.model.num_layers} layers x "
          f"{prof.model.num_query_heads} query heads; top heads {top}")
    print(f"wrote {out}")
    return 0
