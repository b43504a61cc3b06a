"""``headprobe export``: write a profile or budget map in another tool's format."""

from __future__ import annotations

from pathlib import Path

import headprobe as hp

from .common_args import add_force_argument

TARGETS = ("duoattention", "headkv", "layers")


def register(sub, formatter) -> None:
    p = sub.add_parser(
        "export", help="export a profile or budget map for other engines", formatter_class=formatter,
        description="Export to a DuoAttention pattern folder (full_attention_heads.tsv + config.json), a "
                    "HeadKV / Retrieval_Head score JSON, or a per-layer budget list.",
        epilog="examples:\n  headprobe export profiles/smollm2-135m.retrieval_reasoning.json --to duoattention "
               "-o duo/\n  headprobe export budgets/x.json --to layers -o layers.json\n"
               "  headprobe export p.json --to duoattention --full-share 0.25 -o duo/")
    p.add_argument("input", help="headprobe profile or budget file")
    p.add_argument("--to", required=True, choices=TARGETS, help="target format")
    p.add_argument("-o", "--output", required=True, help="output file (folder for duoattention)")
    p.add_argument("--threshold", type=float, default=None, help="duoattention: binarise at this score")
    p.add_argument("--full-share", type=float, default=None, help="duoattention: binarise, this share of heads full")
    p.add_argument("--sink-size", type=int, default=None, help="duoattention config sink_size (default 128)")
    p.add_argument("--recent-size", type=int, default=None, help="duoattention config recent_size (default 256)")
    p.add_argument("--reduction", default=None, help="duoattention: query→KV reduction (default: the profile's)")
    p.add_argument("--exact", action="store_true", help="duoattention: scores as stored (no rescale, ties kept)")
    add_force_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    src = hp.load_file(args.input)
    if args.to == "duoattention":
        out = hp.write_duoattention(src, args.output, sink_size=args.sink_size, recent_size=args.recent_size,
                                 threshold=args.threshold, full_share=args.full_share, exact=args.exact,
                                 reduction=args.reduction, force=args.force)
    elif args.to == "headkv":
        if not isinstance(src, hp.Profile):
            raise hp.HeadprobeError("--to headkv exports head scores: give a profile, not a budget map")
        out = hp.write_headkv_json(src, args.output, force=args.force)
    else:
        if not isinstance(src, hp.BudgetMap):
            raise hp.HeadprobeError("--to layers exports budgets: give a budget map (headprobe allocate)")
        out = hp.write_layer_list(src, args.output, force=args.force)
    print(f"wrote {Path(out)}")
    return 0
