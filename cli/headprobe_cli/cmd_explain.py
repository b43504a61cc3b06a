"""``headprobe explain``: any budget in tokens and bytes, and what every engine allocates for it."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from headprobe.errors import HeadprobeError
from headprobe.files.overwrite import check_overwrite
from headprobe.models.registry import DEFAULT_MODEL

from .common_args import add_force_argument, figure_path

#: Library parameters whose flags are spelled differently.
FLAGS = {"policy_options": "--option", "press_options": "--press-option"}


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = (
        "Explain a KV-cache budget at a context length: the tokens and bytes it keeps per layer and "
        "KV head, its share of a full cache, and what each engine allocates for it: headprobe's runtime "
        "(budgets plus decode room), kvpress (masking presses keep the whole cache), HeadKV and "
        "KVCache-Factory (budgets cut at the prefix; caches per query head on GQA models), DuoAttention "
        "(full heads x N plus streaming heads x (sink + recent)), and for a layer split vLLM (pages of "
        "its window), TensorRT-LLM (a pool per window) and llama.cpp (cells allocated up front). INPUT "
        "is a budget map (a layer split's included) or a layer-split file, one or two profiles "
        "(allocated as `headprobe allocate` would), a DuoAttention folder, or a HeadKV / Retrieval_Head "
        "score file; or give --press and --ratio instead. No model weights are loaded: "
        "--model gives the shape of files that carry none. --to budget writes the equivalent headprobe "
        "budget map, to run it with `headprobe generate --budget`. See docs/explain.md."
    )
    p.epilog = (
        "examples:\n"
        "  headprobe explain budgets/smollm2.headkv.cap128.beta1.2.json --context 4096\n"
        "  headprobe explain profiles/smollm2-135m.retrieval_reasoning.json --context 4096 --capacity 256\n"
        "  headprobe explain attn_patterns/Mistral-7B-Instruct-v0.2 --context 32000 --sparsity 0.5 "
        "--plot duo.png\n"
        "  headprobe explain Meta-Llama-3-8B-Instruct_retrieval_reasoning_heads.json --context 900 "
        "--capacity 128 --beta 1.5 --to budget -o llama3_headkv.json\n"
        "  headprobe explain --press snapkv --ratio 0.75 --model mistral-7b --context 16384 --json out.json\n"
        "  headprobe explain split_map.json --context 8192     # a layer split: vLLM, TensorRT-LLM, llama.cpp"
    )
    p.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="budget map, layer split, profile(s), DuoAttention folder or HeadKV score file")
    p.add_argument("--context", type=int, required=True, metavar="N", help="prompt tokens of each sequence")
    p.add_argument("--model", default=None,
                   help="alias, HF id or folder: the shape of inputs that carry none (read from its config, no "
                        f"weights); default: the input's own model, {DEFAULT_MODEL} for --press")
    p.add_argument("--batch", type=int, default=1, help="sequences at once")
    p.add_argument("--dtype", default="bfloat16", help="element type of the cached keys and values: float32, "
                   "bfloat16 or float16")
    p.add_argument("--max-new-tokens", type=int, default=64, help="tokens generated after the prompt")
    p.add_argument("--policy", default=None, help="headprobe runtime policy: snapkv, streaming or layer_window (default: how the "
                   "budget runs best, printed)")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="policy option, repeatable")
    _add_profile_arguments(p)
    _add_tool_file_arguments(p)
    _add_output_arguments(p)
    add_force_argument(p, "existing outputs")
    p.set_defaults(func=run)


def _add_profile_arguments(p) -> None:
    """The options of a profile's allocation, as ``headprobe allocate`` takes them."""
    g = p.add_argument_group("profiles (allocated as `headprobe allocate` does)")
    g.add_argument("--method", default=None, help="allocation method (default: headkv for a head-score profile, "
                   "dynamickv for a layer-retention profile, combined for both)")
    g.add_argument("--capacity", type=int, default=None,
                   help="profile: mean tokens per KV head (default 128); budget map: rescale to it; HeadKV file: "
                        "HeadKV's --max_capacity_prompts (default 128)")
    g.add_argument("--beta", type=float, default=None, help="HeadKV's beta (profile and HeadKV file; default 1.2)")
    g.add_argument("--window", type=int, default=None, help="profile: last prompt tokens every head keeps (default 8)")
    g.add_argument("--sink", type=int, default=None, help="profile: first prompt tokens every head keeps (default 0)")
    g.add_argument("--temperature", type=float, default=None,
                   help="score temperature (profile; HeadKV file: HeadKV's --temp is 1 / temperature)")
    g.add_argument("--reduction", default=None, help="profile: query->KV head reduction")
    g.add_argument("--task", default=None, help="profile: layer-retention task or mix")


def _add_tool_file_arguments(p) -> None:
    """The options of DuoAttention folders, HeadKV score files and kvpress presses."""
    d = p.add_argument_group("DuoAttention folders")
    d.add_argument("--sparsity", type=float, default=None,
                   help="DuoAttention's --sparsity (default: the raw cut, values above 0.5 are full)")
    d.add_argument("--sink-size", type=int, default=None, help="override the folder's sink_size")
    d.add_argument("--recent-size", type=int, default=None, help="override the folder's recent_size")
    h = p.add_argument_group("HeadKV / Retrieval_Head score files")
    h.add_argument("--gqa", default=None, help="the KV-head equivalent of query-head budgets: mean (KVCache-Factory's "
                   "kv_head granularity, the default) or sum (the memory HeadKV holds)")
    k = p.add_argument_group("kvpress")
    k.add_argument("--press", default=None, help="a kvpress press by name (snapkv, streaming_llm, pyramidkv, adakv, "
                   "knorm, ...), without INPUT")
    k.add_argument("--ratio", type=float, default=None, help="the press's compression_ratio; for a DuoAttention "
                   "folder, DuoAttentionPress' head_compression_ratio (default: --sparsity, else the folder's)")
    k.add_argument("--press-option", action="append", default=[], metavar="KEY=VALUE",
                   help="press option, repeatable (window_size=64, beta=20, n_sink=4, alpha_safeguard=0.2)")


def _add_output_arguments(p) -> None:
    """The files a run writes."""
    o = p.add_argument_group("outputs")
    o.add_argument("--plot", default=None, metavar="FILE", help="figure: the budget and each engine's bytes (PNG/SVG)")
    o.add_argument("--json", default=None, metavar="FILE", help="everything, as headprobe.explain JSON")
    o.add_argument("--to", default=None, choices=["budget"], help="write the equivalent headprobe budget map to -o")
    o.add_argument("-o", "--output", default=None, metavar="FILE", help="the budget map --to budget writes")


def _outputs(args) -> dict[str, Path]:
    """The files this run writes, each checked before anything is read."""
    if (args.to is None) != (args.output is None):
        raise HeadprobeError("--to budget and -o FILE go together")
    out = {}
    if args.json:
        out["json"] = Path(args.json)
    if args.plot:
        out["plot"] = figure_path(args.plot)
    if args.output:
        out["budget"] = Path(args.output)
    paths = [p.resolve() for p in out.values()]
    if len(set(paths)) != len(paths):
        raise HeadprobeError("--json, --plot and -o name the same file; give each its own")
    for path in out.values():
        check_overwrite(path, args.force)
    return out


def run(args) -> int:
    outputs = _outputs(args)
    return _explain(args, outputs)


def _explain(args, outputs: dict[str, Path]) -> int:
    """The explanation, printed, and the files of ``outputs`` (checked already), written."""
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.explain.api import explain_budget
    from headprobe.explain.report import format_explanation
    from headprobe.runtime.generate import parse_policy_options

    ex = explain_budget(
        args.inputs, context=args.context, model=args.model, batch=args.batch, dtype=args.dtype,
        max_new_tokens=args.max_new_tokens, policy=args.policy,
        policy_options=parse_policy_options(args.option) if args.option else None, method=args.method,
        capacity=args.capacity, beta=args.beta, window=args.window, sink=args.sink, temperature=args.temperature,
        reduction=args.reduction, task=args.task, sparsity=args.sparsity, sink_size=args.sink_size,
        recent_size=args.recent_size, gqa=args.gqa, press=args.press, ratio=args.ratio,
        press_options=(parse_policy_options(args.press_option, "--press-option") if args.press_option
                       else None))
    if "budget" in outputs and ex.source["kind"] == "budget_map":
        raise HeadprobeError(f"--to budget: {args.inputs[0]} is a budget map already")
    _warn_beyond_context(ex)
    print(format_explanation(ex))
    if "json" in outputs:
        print(f"wrote {ex.save_json(outputs['json'], args.force)}")
    if "plot" in outputs:
        print(f"wrote {_save_figure(ex, outputs['plot'], args.force)}")
    if "budget" in outputs:
        path = ex.save_budget(outputs["budget"], args.force)
        print(f"wrote {path}; run it with: {ex.generate_command(path)} PROMPT")
    return 0


def _save_figure(ex, path: Path, force: bool) -> Path:
    """``--plot``: the budget and each engine's bytes."""
    # loads matplotlib: imported when a figure is drawn, not for --help
    from headprobe.explain.figure import save_explain_figure

    return save_explain_figure(ex, path, force)


def _warn_beyond_context(ex) -> None:
    """One line on stderr when ``--context`` (with the new tokens) is beyond the model's context: the
    figures are still computed, for a cache no run of the model fills."""
    m, s = ex.model, ex.setting
    if m.max_context and s.context + s.max_new_tokens > m.max_context:
        print(f"headprobe: warning: --context {s.context}: {s.context:,} prompt tokens + {s.max_new_tokens} new "
              f"tokens are beyond {m.name}'s context of {m.max_context:,} tokens; the figures below are for a "
              "cache the model cannot fill", file=sys.stderr)
