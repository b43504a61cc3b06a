"""Arguments several commands share, defined once: the model and how to load it, the form prompts are
rendered in (``--prompt-format``), and what to do with the files an earlier run left (``--resume``,
``--force``)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headprobe.errors import HeadprobeError
from headprobe.eval.babi import BABI_TASKS
from headprobe.haystack.prompt_format import PROMPT_FORMATS, wants_chat_template
from headprobe.models.loading import DTYPES, LoadedModel
from headprobe.models.placement import parse_max_memory
from headprobe.models.registry import DEFAULT_MODEL

if TYPE_CHECKING:
    from headprobe.distributed.ranks import Ranks

MODEL_HELP = "alias, Hugging Face id or local directory"


def add_model_argument(parser: argparse.ArgumentParser, default: str | None = DEFAULT_MODEL,
                       help: str = MODEL_HELP) -> None:
    """``--model``: which model (``headprobe models`` lists the aliases)."""
    parser.add_argument("--model", default=default, help=help)


def add_loading_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model --device --dtype --trust-remote-code``: for the commands that load a model's weights."""
    add_model_argument(parser)
    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:N or auto (device_map=auto); unset: the GPU if there is one, "
                             "else the CPU")
    parser.add_argument("--dtype", default="auto", choices=DTYPES,
                        help="auto: bfloat16 on a GPU, float32 on the CPU")
    parser.add_argument("--trust-remote-code", action="store_true", help="allow models that run their own code")
    parser.add_argument("--max-memory", nargs="+", metavar="DEVICE=SIZE",
                        help="with --device auto: the most each device holds, e.g. 0=20GiB 1=20GiB cpu=64GiB; "
                             "layers that do not fit stay on disk")
    parser.add_argument("--offload-folder", metavar="DIR",
                        help="with --device auto: folder for the layers placed on disk (a safetensors checkpoint "
                             "needs none)")


def load_model(args: argparse.Namespace, ranks: Ranks | None = None) -> LoadedModel:
    """The model named by :func:`add_loading_arguments`' arguments.

    Under ``torchrun`` (``ranks``) each rank loads its own copy on its own device (GPU ``LOCAL_RANK``), the
    first rank of each machine before the others (it converts and caches the files once).
    """
    # the library's load_model, imported here: this function's own name hides it at module level
    from headprobe.models.loading import load_model

    max_memory = parse_max_memory(args.max_memory) if args.max_memory else None
    device = ranks.device(args.device) if ranks is not None else args.device
    with ranks.local_main_first() if ranks is not None else contextlib.nullcontext():
        return load_model(args.model, device=device, dtype=args.dtype,
                          trust_remote_code=args.trust_remote_code, max_memory=max_memory,
                          offload_folder=args.offload_folder)


#: What ``--prompt-format plain`` renders, for the commands that build the prompts themselves.
PLAIN_HELP = "the document, the question and the answer cue 'Answer:' at the end (base models)"


def add_prompt_format_arguments(parser: argparse.ArgumentParser, plain_flag: str = "--no-chat-template",
                                plain_help: str = PLAIN_HELP) -> None:
    """``--prompt-format {auto,chat,plain}`` and its older spelling of ``plain`` (``--no-chat-template``; the
    ``generate`` command's ``--no-chat``).

    Parameters
    ----------
    plain_flag
        The switch that means ``--prompt-format plain``.
    plain_help
        What the plain form is, for the command's help.
    """
    parser.add_argument("--prompt-format", choices=PROMPT_FORMATS, default="auto",
                        help=f"chat: the model's chat template; plain: {plain_help}; auto (default): chat when "
                             "the tokenizer has a chat template, else plain")
    parser.add_argument(plain_flag, dest="no_chat_template", action="store_true", help="same as --prompt-format plain")


def chat_template_wanted(args: argparse.Namespace) -> bool:
    """The library's ``chat_template`` switch for :func:`add_prompt_format_arguments`' arguments; a
    contradiction (``--prompt-format chat`` with ``--no-chat-template``) is refused before the model loads."""
    return wants_chat_template(args.prompt_format, not args.no_chat_template)


def resolve_prompt_format(args: argparse.Namespace, tokenizer: Any) -> str:
    """The form the run uses (``"chat"`` or ``"plain"``) once the model is loaded; ``--prompt-format chat``
    for a tokenizer without a chat template is refused here, before any work."""
    # the library's resolve_prompt_format, imported here: this function's own name hides it at module level
    from headprobe.haystack.prompt_format import resolve_prompt_format

    return resolve_prompt_format(tokenizer, args.prompt_format, not args.no_chat_template)


def rank_progress(ranks: Ranks, progress: Callable[..., Any] | None) -> Callable[..., Any] | None:
    """Progress bars on rank 0 only: the ranks share one terminal."""
    return progress if ranks.is_main else None


def rank_note(ranks: Ranks, text: str) -> None:
    """A line on stderr from a rank other than 0 (``rank 1/2: ...``); rank 0 reports the merged run."""
    if not ranks.is_main:
        print(f"rank {ranks.rank}/{ranks.world_size}: {text}", file=sys.stderr)


def add_rerun_arguments(parser: argparse.ArgumentParser, log: str, replaced: str) -> None:
    """``--resume --force`` of a command that logs its work as it goes.

    Parameters
    ----------
    log
        What the finished work is kept in ("its trial logs").
    replaced
        What ``--force`` replaces ("the trial logs").
    """
    parser.add_argument("--resume", action="store_true", help=f"continue an interrupted run from {log}")
    parser.add_argument("--force", action="store_true", help=f"start over, replacing {replaced}")


def add_force_argument(parser: argparse.ArgumentParser, what: str = "an existing output") -> None:
    """``--force`` of a command that writes one output: overwrite it."""
    parser.add_argument("--force", action="store_true", help=f"overwrite {what}")


#: Library parameters of the task readers and the flags :func:`add_task_arguments` gives them (errors name
#: them by these flags).
TASK_FLAGS = {"source": "--dataset", "context_field": "--fields", "question_field": "--fields",
              "answers_field": "--fields", "tasks": "--babi-tasks", "count": "--babi-count"}


class _Unset:
    """A flag's default, told apart from the same value typed (``--lengths 1000 2000``)."""


class _UnsetInt(_Unset, int):
    pass


class _UnsetFloat(_Unset, float):
    pass


class _UnsetStr(_Unset, str):
    pass


class _UnsetList(_Unset, list):
    pass


def unset(value):
    """``value`` as a default that :func:`typed` knows was not typed (``--help`` shows it as ``value``)."""
    kinds = {int: _UnsetInt, float: _UnsetFloat, str: _UnsetStr, list: _UnsetList}
    return kinds[type(value)](value)


def plain(value):
    """An :func:`unset` default as the plain value it stands for; any other value as it is."""
    if isinstance(value, _Unset):
        return next(kind(value) for kind in (list, str, float, int) if isinstance(value, kind))
    return value


def typed(args: argparse.Namespace, dest: str) -> bool:
    """Whether the flag of ``dest`` was typed: a value other than ``None``, ``False`` or an :func:`unset`
    default (a typed value equal to the default counts as typed)."""
    value = getattr(args, dest, None)
    return not (isinstance(value, _Unset) or value is None or value is False)


def add_task_arguments(parser: argparse.ArgumentParser) -> None:
    """The items and grid of an evaluation task, shared by ``eval`` and ``tune``: the needle grid
    (``--needles --needle-ids --haystack --lengths --depths``), bAbI-style questions (``--babi-count
    --babi-tasks``) and an outside QA dataset (``--dataset --split --fields --limit --max-length``).
    :func:`check_task_flags` refuses those of another task."""
    parser.add_argument("--needles", default=None, help="needle file (JSONL; default: the shipped retrieval needles)")
    parser.add_argument("--needle-ids", nargs="+", default=None, help="use only these needles")
    parser.add_argument("--haystack", default=None,
                        help="haystack text file or folder of .txt (default: shipped corpus)")
    parser.add_argument("--lengths", nargs="+", type=int, default=unset([1000, 2000]), help="prompt lengths in tokens")
    parser.add_argument("--depths", nargs="+", type=float, default=unset([0, 50, 100]),
                        help="needle depths in percent")
    parser.add_argument("--babi-count", type=int, default=unset(8), help="bAbI-style questions (--task babi)")
    parser.add_argument("--babi-tasks", nargs="+", default=unset(list(BABI_TASKS)), help="question types")
    parser.add_argument("--dataset", help="--task dataset: local file/folder or hub name")
    parser.add_argument("--split", default=None, metavar="NAME",
                        help="--task dataset: the split of a folder or hub dataset holding several (default: its "
                             "only split)")
    parser.add_argument("--fields", default=None, metavar="ROLE=NAME,...",
                        help="--task dataset: field names, e.g. context=context,question=input,answer=answers"
                             "[,id=_id] (default: context; question, else input; answer, else answers)")
    parser.add_argument("--limit", type=int, default=None, help="first N dataset rows")
    parser.add_argument("--max-length", type=int, default=unset(4000),
                        help="--task dataset: cut prompts to this many tokens")


#: Task flag destination → the tasks (``--task``) that read it; typed for another task, it is refused.
TASK_READERS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("needles", "needle_ids"), ("needle", "longgen")),
    **dict.fromkeys(("haystack", "depths"), ("needle", "babi", "longgen")),
    "lengths": ("needle", "babi", "longgen", "ruler"),
    **dict.fromkeys(("babi_count", "babi_tasks"), ("babi",)),
    **dict.fromkeys(("split", "fields", "max_length"), ("dataset",)),
    **dict.fromkeys(("dataset", "limit"), ("dataset", "ruler")),
}


def check_task_flags(args: argparse.Namespace, tasks: Sequence[str]) -> None:
    """Refuse a task flag typed for a task that does not read it (``--lengths`` with ``--task dataset``,
    ``--needle-ids`` with ``--task babi``) and ``--split`` for a dataset that is one file (it has no
    splits); then give the defaults left as plain values.

    Parameters
    ----------
    tasks
        The command's tasks (the choices of its ``--task``), named in the message.

    Raises
    ------
    HeadprobeError
        Naming the flag and the tasks that read it.
    """
    for dest, readers in TASK_READERS.items():
        if args.task not in readers and typed(args, dest):
            names = [t for t in readers if t in tasks]
            listed = ", ".join(names[:-1]) + (" or " if len(names) > 1 else "") + names[-1]
            raise HeadprobeError(f"--{dest.replace('_', '-')}: applies to --task {listed} only, not "
                                 f"--task {args.task}")
    if args.task == "dataset" and typed(args, "split") and args.dataset and Path(args.dataset).is_file():
        raise HeadprobeError(f"--split {args.split}: chooses a split of a dataset folder or hub dataset; "
                             f"--dataset {args.dataset} is one file, read whole")
    for dest in TASK_READERS:
        setattr(args, dest, plain(getattr(args, dest, None)))


def output_figure(plot: str | None, out: Path) -> Path | None:
    """The figure a command writes beside its result ``out``: ``--plot FILE``, ``none`` for no figure, and by
    default ``out`` with ``.png``."""
    if (plot or "").lower() == "none":
        return None
    return figure_path(plot) if plot else out.with_suffix(".png")


def figure_path(text: str) -> Path:
    """The file a figure named on the command line is saved to: ``.png`` added when it has no suffix;
    a suffix other than a plot format is refused (before the model loads)."""
    path = Path(text)
    fmt = path.suffix.lstrip(".").lower()
    if not fmt:
        return path.with_suffix(".png")
    if fmt not in plot_formats():
        raise HeadprobeError(f"{text}: plot format must be one of {', '.join(plot_formats())}, got {fmt!r}")
    return path


def plot_formats() -> tuple[str, ...]:
    """The image formats a figure may be written in (``--format``, a figure name's suffix)."""
    # loads matplotlib: imported when a format is checked or listed, not while the parser is built
    from headprobe.plots.profile_figures import PLOT_FORMATS

    return PLOT_FORMATS


class LazyChoices(Sequence[str]):
    """Choices that come from the library only when argparse uses them: to check a value given on the
    command line, or to list them in the command's own ``--help``.

    Give the argument a ``metavar`` too: argparse then leaves the choices alone while the parser is
    built, so building it imports nothing heavy (the policies need torch). ``%(choices)s`` in the
    help lists them.
    """

    def __init__(self, names: Callable[[], Iterable[str]]) -> None:
        self._names = names
        self._loaded: tuple[str, ...] | None = None

    def _get(self) -> tuple[str, ...]:
        if self._loaded is None:
            self._loaded = tuple(self._names())
        return self._loaded

    def __getitem__(self, index):  # type: ignore[override]
        return self._get()[index]

    def __len__(self) -> int:
        return len(self._get())

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __contains__(self, value: object) -> bool:
        return value in self._get()
