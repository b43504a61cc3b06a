"""Entry point of the ``headprobe`` command.

Each subcommand lives in its own module with ``register(subparsers)``; the module sets
``func=run`` on its parser, and may name in ``FLAGS`` the flags whose names differ from the library
parameters they set (errors raised while the command runs spell parameters as its flags). Errors derived
from :class:`headprobe.HeadprobeError` are printed as one line (``headprobe: error: ...``) with exit
status 2; ``--debug`` shows the traceback instead.

Building the parser imports no torch, transformers or matplotlib: a command module imports each library
name from the module that defines it (a public name of :mod:`headprobe` or :mod:`headprobe.frontend`), at
the top of the module when that module loads none of them, else inside the function that uses it, when the
command runs; so ``headprobe --help`` answers at once.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn, TextIO

import headprobe
from headprobe.errors import HeadprobeError, flag_spelling

#: The commands, in the order ``--help`` lists them, with their one-line help; ``cmd_NAME.register`` fills
#: each one's parser. Only the command a line names is imported, so ``headprobe --help`` loads no command.
COMMANDS = {
    "models": "list model aliases and their Hugging Face ids",
    "profile": "profile retrieval, retrieval-reasoning heads and layer retention",
    "inspect": "validate and summarise a headprobe file",
    "allocate": "turn profiles into per-head KV-cache budgets",
    "export": "export a profile or budget map for other engines",
    "import": "import HeadKV, Retrieval_Head or DuoAttention files as profiles",
    "plot": "plot head scores, comparisons, layer retention or budget maps",
    "generate": "generate with a per-head compressed KV cache",
    "eval": "accuracy vs cache memory on needle, bAbI-style or outside QA tasks",
    "tune": "search the setting that keeps the most accuracy at a cache size",
    "ablate": "mask top-k heads vs k random heads; needle accuracy of each",
    "explain": "any budget in tokens and bytes, and what each engine really allocates for it",
}


class _Formatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    pass


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, like every other headprobe error (exit status 2);
    subcommand parsers are of this class too (argparse makes them with the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"headprobe: error: {message} (see {self.prog} --help)\n")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The ``headprobe`` parser; with ``only``, that command's options alone are built (every command is still
    listed, by its one-line help), so parsing a command line imports one command module, not twelve."""
    parser = _Parser(
        prog="headprobe", formatter_class=_Formatter,
        description="Profile attention heads and layers, allocate KV-cache budgets, apply them in generate.",
        epilog="example:\n  headprobe profile            # profile the embedded SmolLM2-135M\n"
               "  headprobe inspect profiles/smollm2-135m.retrieval_reasoning.json",
    )
    parser.add_argument("--version", action="version", version=f"headprobe {headprobe.__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, summary in COMMANDS.items():
        command_parser = sub.add_parser(name, help=summary, formatter_class=_Formatter)
        if only is None or name == only:
            importlib.import_module(f"headprobe_cli.cmd_{name}").register(command_parser)
    return parser


def command_named(argv: list[str]) -> str:
    """The command a command line names: its first word that is not an option ("" when there is none)."""
    return next((word for word in argv if not word.startswith("-")), "")


#: Folders whose warnings are headprobe's own: the library and this command.
_OWN = (str(Path(headprobe.__file__).resolve().parent), str(Path(__file__).resolve().parent))


def _own(filename: str) -> bool:
    try:
        return str(Path(filename).resolve()).startswith(_OWN)
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """While a command runs, print headprobe's warnings as one line, ``headprobe: warning: ...`` (like its
    errors), without Python's category and source line; other packages' warnings print as usual. The
    previous ``warnings.showwarning`` is restored afterwards, so library users see plain Python warnings."""
    previous = warnings.showwarning

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: TextIO | None = None, line: str | None = None) -> None:
        if not _own(filename):
            previous(message, category, filename, lineno, file, line)
            return
        text = str(message).removeprefix("headprobe: ")
        with contextlib.suppress(OSError):
            print(f"headprobe: warning: {text}", file=file or sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(only=command_named(argv))
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    module = importlib.import_module(f"headprobe_cli.cmd_{args.command}")
    try:
        with flag_spelling(getattr(module, "FLAGS", {})), one_line_warnings():
            result = args.func(args)
    except HeadprobeError as exc:
        if args.debug:
            raise
        print(f"headprobe: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("headprobe: interrupted; finished work is saved (rerun with --resume to continue)", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
