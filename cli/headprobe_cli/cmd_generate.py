"""``headprobe generate``: answer a prompt with a compressed KV cache and report its memory."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from headprobe.errors import HeadprobeError
from headprobe.eval.settings import MAP_ALLOCATION, EvalSetting, parse_setting, split_capacities
from headprobe.limits import check_count

from .common_args import (
    LazyChoices,
    add_loading_arguments,
    add_prompt_format_arguments,
    chat_template_wanted,
    load_model,
    resolve_prompt_format,
)

if TYPE_CHECKING:
    from headprobe.models.loading import LoadedModel

#: Library parameters whose flag is not ``--`` + the parameter name (errors name them by these flags).
FLAGS = {"chat_template=False": "--no-chat", "spec": "--setting", "specs": "--setting"}


def register(p: argparse.ArgumentParser) -> None:
    """Fill the parser ``main`` made for this command (its name and one-line help are ``main.COMMANDS``)."""
    p.description = (
        "Generate an answer with a compressed KV cache (per-layer, per-KV-head budgets) and print "
        "the real cache size next to a full cache."
    )
    p.epilog = (
        "examples:\n"
        "  headprobe generate --capacity 128 --policy snapkv \"Summarise: ...\"\n"
        "  headprobe generate --budget budgets/smollm2.headkv.json --policy keydiff "
        "--option block_size=128 \"...\"\n"
        "  headprobe generate --ratio 0.1 --policy morphkv --option window=32 --prompt-file doc.txt\n"
        "  headprobe generate --setting \"headkv-r[window=32]@64\" \"...\"      # an eval setting\n"
        "  headprobe generate --setting \"snapkv:tune/tune.c64.budget.json[window=32]\" \"...\"   # tune's"
    )
    p.add_argument("prompt", nargs="?", help="the prompt (or use --prompt-file, or - for stdin)")
    p.add_argument("--prompt-file", help="read the prompt from this file")
    add_loading_arguments(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--budget", metavar="FILE", help="budget file (headprobe.budget JSON) for this model")
    src.add_argument("--ratio", type=float, help="keep this fraction of the prompt in every head")
    p.add_argument("--capacity", type=int, default=None,
                   help="mean tokens per head (default 128; with --budget, rescales the file to this capacity)")
    p.add_argument("--policy", default="snapkv", choices=LazyChoices(_policy_names),
                   metavar="POLICY", help="which tokens to keep: %(choices)s")
    p.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="policy option, repeatable (e.g. window=16, key_merge=zip)")
    p.add_argument("--setting", default=None, metavar="SETTING",
                   help="an eval setting (a preset, POLICY:ALLOCATION:PROFILE[options]@CAPACITY or POLICY:MAP.json"
                        "[options], e.g. the setting string headprobe tune writes) instead of --policy, --option, "
                        "--budget, --ratio and --capacity")
    p.add_argument("--max-new-tokens", type=int, default=64)
    add_prompt_format_arguments(p, plain_flag="--no-chat", plain_help="the prompt as written")
    p.add_argument("--kernels", default="auto", choices=["auto", "torch", "triton"],
                   help="Triton kernels or the PyTorch path")
    p.set_defaults(func=run)


def _policy_names() -> list[str]:
    """The policies ``--policy`` takes, for argparse's check of a value given and for ``--help``."""
    # loads torch: imported when the choices are used, not while the parser is built
    from headprobe.runtime.policies import POLICIES

    return sorted(POLICIES)


def _prompt(args: argparse.Namespace) -> str:
    if args.prompt_file:
        try:
            with open(args.prompt_file, encoding="utf-8") as handle:
                return handle.read()
        except OSError as exc:
            raise HeadprobeError(f"--prompt-file {args.prompt_file}: {exc.strerror}") from exc
    if args.prompt == "-" or (args.prompt is None and not sys.stdin.isatty()):
        return sys.stdin.read()
    if not args.prompt:
        raise HeadprobeError("give a prompt, --prompt-file FILE, or - to read stdin")
    return args.prompt


def prompt_token_count(lm: LoadedModel, prompt: str, chat: bool) -> int:
    """Tokens of ``prompt`` as ``generate_compressed`` feeds it (in the chat template with ``chat``)."""
    tokenizer = lm.tokenizer
    if chat:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                               add_generation_prompt=True)
    return len(tokenizer(prompt, add_special_tokens=not chat)["input_ids"])


def check_prompt_fits(lm: LoadedModel, prompt: str, chat: bool, args: argparse.Namespace) -> None:
    """Refuse a prompt that, with the tokens to generate, runs past the model's context (as ``profile``
    refuses lengths beyond it): the positions past it were never trained and the answer means nothing.
    ``chat``: whether the prompt is wrapped in the chat template (the resolved ``--prompt-format``)."""
    context = lm.identity.max_context
    if not context:
        return
    tokens = prompt_token_count(lm, prompt, chat=chat)
    if tokens + args.max_new_tokens > context:
        source = f"--prompt-file {args.prompt_file}" if args.prompt_file else "the prompt"
        raise HeadprobeError(
            f"{source}: {tokens:,} prompt tokens + {args.max_new_tokens:,} new tokens (--max-new-tokens) exceed "
            f"{lm.identity.name}'s context of {context:,} tokens; shorten the prompt or generate fewer tokens")


def _mib(n: int) -> str:
    return f"{n:,} bytes ({n / 2**20:.2f} MiB)"


def _setting(args: argparse.Namespace) -> EvalSetting:
    """The eval setting ``--setting`` names, checked before the model loads.

    Raises
    ------
    HeadprobeError
        ``--setting`` with a flag it replaces, a bad setting, one without a capacity (give ``@N``), or one
        whose window is the question (a prompt here has no question the harness placed).
    """
    given = [flag for flag, value in (("--policy", args.policy != "snapkv"), ("--option", args.option),
                                      ("--budget", args.budget), ("--ratio", args.ratio),
                                      ("--capacity", args.capacity is not None)) if value]
    if given:
        raise HeadprobeError(f"--setting {args.setting}: it names the policy, its options and the budget; drop "
                             f"{', '.join(given)}")
    spec, pinned = split_capacities(args.setting)
    parsed = parse_setting(spec)
    if parsed.policy != "full" and parsed.allocation != MAP_ALLOCATION and pinned is None:
        raise HeadprobeError(f"--setting {args.setting}: give its capacity after @ (e.g. {spec}@64)")
    setting = EvalSetting.parse(args.setting)
    if setting.question_window:
        raise HeadprobeError(f"--setting {args.setting}: window=question needs a prompt whose question the eval "
                             "harness placed; give a window in tokens")
    setting.check_policy()
    return setting


def run(args: argparse.Namespace) -> int:
    check_count("max_new_tokens", args.max_new_tokens)
    chat_template_wanted(args)                   # a contradiction fails before the model loads
    if args.capacity is not None:
        check_count("capacity", args.capacity)
    if args.ratio is not None and not 0 < args.ratio <= 1:      # before the model loads
        raise HeadprobeError(f"--ratio {args.ratio}: expected a number in (0, 1]")
    setting = _setting(args) if args.setting is not None else None
    prompt = _prompt(args)
    return _generate(args, setting, prompt)


def _generate(args: argparse.Namespace, setting: EvalSetting | None, prompt: str) -> int:
    """The answer and its cache's size, once the command line and the prompt are checked."""
    # loads torch and transformers: imported when the command runs, not for --help
    from headprobe.eval.runner import resolve_budget
    from headprobe.runtime.generate import generate_compressed, make_policy, parse_policy_options
    from headprobe.runtime.kernels.dispatch import set_kernel_backend
    from headprobe.runtime.split_budget import load_budget_file

    if setting is None:
        options = parse_policy_options(args.option)
        policy = make_policy(args.policy, **options)   # bad options fail before the model loads
        budget = load_budget_file(args.budget) if args.budget else None   # a budget map or a layer split
    set_kernel_backend(args.kernels)
    lm = load_model(args)
    form = resolve_prompt_format(args, lm.tokenizer)
    check_prompt_fits(lm, prompt, form == "chat", args)
    if setting is not None:
        policy = make_policy(setting.policy, **setting.options)
        budget = resolve_budget(lm, setting)
        args.policy = setting.policy
    res = generate_compressed(lm, prompt, policy=policy, budget=budget, ratio=args.ratio,
                              capacity=args.capacity, max_new_tokens=args.max_new_tokens,
                              chat=form == "chat")
    print(res.texts[0].strip())
    cache = res.cache
    kept = cache.kept_tokens()
    prompt_len = int(cache.prompt_lengths[0])
    full = cache.full_cache_bytes()
    used = cache.memory_bytes()
    print(f"cache: {_mib(used)} ({args.policy}, {int(kept.sum())} tokens kept over {kept[0].numel()} KV heads, "
          f"{int(kept.min())}-{int(kept.max())} per head) vs full cache {_mib(full)} "
          f"for {prompt_len} prompt + {res.new_tokens.shape[1]} new tokens: {used / max(full, 1):.1%}"
          + (f" ({_why_above_full(cache)})" if used > full else ""))
    return 0


def _why_above_full(cache) -> str:
    """Why a compressed cache holds more bytes than the full cache of the same tokens, in a few words."""
    stores = [s for s in cache.stores if s is not None]
    held = sum(int(s.host_lengths.sum()) for s in stores)
    room = sum(int(s.host_capacity.sum()) for s in stores) - held
    seen = stores[0].batch * stores[0].kv_heads * len(stores) * cache.layers[0].seen
    dropped = max(seen - held, 0)
    what = ("the budget is no smaller than this prompt, so every head keeps all of it" if dropped == 0 else
            f"the budget drops only {dropped} of {seen} tokens over all heads")
    return (f"above the full cache: {what}, and the compressed cache adds a position per token, a spare row per "
            f"layer and {room} rows of decode room not used by this answer")
