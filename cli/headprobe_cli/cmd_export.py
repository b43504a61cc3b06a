"""``headprobe export``: write a profile or budget map in another tool's format."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from headprobe.errors import HeadprobeError
from headprobe.files.jsonio import read_json

from .common_args import add_force_argument

TARGETS = ("duoattention", "headkv", "layers", "kvpress-layers", "vllm", "tensorrt-llm", "llama.cpp")
#: Targets that take a layer split (a split file, or a map of `allocate --method layer_split`).
SPLIT_TARGETS = ("vllm", "tensorrt-llm", "llama.cpp")


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = (
        "Export to a DuoAttention pattern folder (full_attention_heads.tsv + config.json), a "
        "HeadKV / Retrieval_Head score JSON, a per-layer budget list, or per-layer removal ratios "
        "for kvpress' PerLayerCompressionPress; a layer split as vLLM hf_overrides, TensorRT-LLM "
        "KvCacheConfig fields or llama.cpp GGUF metadata. See docs/interop.md for what each engine reads."
    )
    p.epilog = (
        "examples:\n  headprobe export profiles/smollm2-135m.retrieval_reasoning.json --to duoattention "
        "--full-share 0.25 -o duo/\n  headprobe export budgets/x.json --to duoattention -o duo/\n"
        "  headprobe export budgets/x.json --to layers -o layers.json\n"
        "  headprobe export budgets/x.json --to kvpress-layers --prompt-len 2048 -o ratios.json\n"
        "  headprobe export split.json --to vllm -o vllm_overrides.json   # a layer split (docs/interop.md)"
    )
    p.add_argument("input", help="headprobe profile or budget file")
    p.add_argument("--to", required=True, choices=TARGETS, help="target format")
    p.add_argument("-o", "--output", required=True, help="output file (folder for duoattention)")
    p.add_argument("--threshold", type=float, default=None,
                   help="duoattention: heads whose score is at or above this are full")
    p.add_argument("--full-share", type=float, default=None,
                   help="duoattention: this share of the heads is full (default 0.5; an imported DuoAttention "
                        "pattern keeps its own split)")
    p.add_argument("--binary", action="store_true", help="duoattention: write 1/0 instead of ranked values")
    p.add_argument("--sink-size", type=int, default=None,
                   help="duoattention: sink_size (a budget map's sink; for a profile default 128)")
    p.add_argument("--recent-size", type=int, default=None,
                   help="duoattention: recent_size (a budget map's window; for a profile default 256)")
    p.add_argument("--reduction", default=None, help="duoattention: query→KV reduction (default: the profile's)")
    p.add_argument("--exact", action="store_true", help="duoattention: scores as stored (no split, no rescale)")
    p.add_argument("--prompt-len", type=int, default=None,
                   help="kvpress-layers: context tokens kvpress compresses (default: the map's prompt_len)")
    add_force_argument(p)
    p.set_defaults(func=run)


def run(args) -> int:
    # loads numpy: imported when the command runs, not for --help
    from headprobe.budget_map import BudgetMap
    from headprobe.profile import Profile
    from headprobe.tool_files.duoattention import write_duoattention
    from headprobe.tool_files.headkv_json import write_headkv_json
    from headprobe.tool_files.layer_list import write_kvpress_ratios, write_layer_list

    if args.to in SPLIT_TARGETS:
        return _run_split(args)
    src = _profile_or_budget(args.input)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if args.to == "duoattention":
            out = write_duoattention(src, args.output, sink_size=args.sink_size, recent_size=args.recent_size,
                                     threshold=args.threshold, full_share=args.full_share, binary=args.binary,
                                     exact=args.exact, reduction=args.reduction, force=args.force)
        elif args.to == "headkv":
            if not isinstance(src, Profile):
                raise HeadprobeError("--to headkv exports head scores: give a profile, not a budget map")
            out = write_headkv_json(src, args.output, force=args.force)
        else:
            if not isinstance(src, BudgetMap):
                raise HeadprobeError(f"--to {args.to} exports budgets: give a budget map "
                                     "(headprobe allocate)")
            if args.to == "layers":
                out = write_layer_list(src, args.output, force=args.force)
            else:
                out = write_kvpress_ratios(src, args.output, args.prompt_len, force=args.force)
    for w in caught:
        print(f"headprobe: warning: {w.message}", file=sys.stderr)
    print(f"wrote {Path(out)}")
    if args.to == "duoattention" and not args.exact:
        cfg = read_json(Path(out) / "config.json")
        info = cfg.get("headprobe", {})
        print(f"{info.get('full_heads')} full and {info.get('streaming_heads')} streaming KV heads; sparsity "
              f"{cfg['sparsity']!r} (DuoAttention --sparsity, kvpress head_compression_ratio), sink_size "
              f"{cfg['sink_size']}, recent_size {cfg['recent_size']}")
        if info.get("note"):
            print(info["note"])
    return 0


def _profile_or_budget(path: str):
    """The profile or budget map at ``path``; an eval result is refused (nothing in it exports)."""
    # loads numpy: imported when the command runs, not for --help
    from headprobe.eval.result import EvalResult
    from headprobe.file_summary import load_file

    src = load_file(path)
    if isinstance(src, EvalResult):
        raise HeadprobeError(f"{path}: an eval result; export takes a profile or a budget map")
    return src


def _run_split(args) -> int:
    """``--to vllm|tensorrt-llm|llama.cpp``: a split file or a layer-split budget map, as the engine reads it."""
    # loads numpy: imported when the command runs, not for --help
    from headprobe.layer_split import LayerSplit
    from headprobe.tool_files.engine_windows import write_engine_split

    obj = read_json(args.input)
    fmt = obj.get("format") if isinstance(obj, dict) else None
    src = LayerSplit.load(args.input) if fmt == "headprobe.layer_split" else _profile_or_budget(args.input)
    out = write_engine_split(src, args.to, args.output, force=args.force)
    kept = read_json(out)["keeps"]
    print(f"wrote {Path(out)}")
    print(f"{args.to} keeps {kept['bytes']:,} of {kept['full_bytes']:,} bytes ({kept['share']:.1%}) at "
          f"{kept['context']} tokens; global layers {kept['global_layers']}")
    return 0
