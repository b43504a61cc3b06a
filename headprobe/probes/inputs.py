"""The input files a profiling request names, each read once for all its passes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..haystack.corpus import Haystack, load_haystack
from ..haystack.needles import NeedleFiles, read_needle_files
from ..haystack.tasks import TaskSample, load_tasks
from .registry import passes_for, probe_passes

if TYPE_CHECKING:
    from .request import ProfileRequest


class RunInputs:
    """The needle files, haystack and task prompts of a request, each read (and checked) the first time a
    pass asks for it.

    :meth:`check_given` reads what the request gives that no requested pass read, so that a bad file is
    refused before the model loads whichever probes were asked for.
    """

    def __init__(self, request: ProfileRequest) -> None:
        self.request = request
        self._needle_files: NeedleFiles | None = None
        self._haystack: Haystack | None = None
        self._task_samples: list[TaskSample] | None = None

    def needle_files(self) -> NeedleFiles:
        """The request's needle files, each read once; refused: a file given twice, a file none of whose
        needles a requested pass reads, an id two files share."""
        if self._needle_files is None:
            self._needle_files = read_needle_files(list(self.request.needle_files), needle_kinds(self.request.probes),
                                                   needle_readers())
        return self._needle_files

    def haystack(self) -> Haystack:
        """The request's haystack (the shipped corpus when it names none)."""
        if self._haystack is None:
            self._haystack = load_haystack(self.request.haystack)
        return self._haystack

    def task_samples(self) -> list[TaskSample]:
        """The request's layer-retention task prompts (``tasks``, ``samples_per_task``), task by task."""
        if self._task_samples is None:
            tasks = list(self.request.tasks) if self.request.tasks is not None else None
            self._task_samples = [s for group in load_tasks(tasks, samples_per_task=self.request.samples_per_task)
                                  .values() for s in group]
        return self._task_samples

    def check_given(self) -> None:
        """Read the needle files and the haystack the request gives, if no pass has."""
        if self.request.needle_files:
            self.needle_files()
        if self.request.haystack is not None:
            self.haystack()


def needle_readers() -> dict[str, str]:
    """Needle kind → the probes that read it (``{"retrieval": "retrieval or enhanced_retrieval", ...}``)."""
    readers: dict[str, list[str]] = {}
    for probe_pass in probe_passes():
        kind = probe_pass.implementation.needle_kind
        if kind is not None:
            readers.setdefault(kind, []).extend(probe_pass.kinds)
    return {kind: " or ".join(kinds) for kind, kinds in readers.items()}


def needle_kinds(probes: Iterable[str]) -> set[str]:
    """The needle kinds (``"retrieval"``, ``"reasoning"``) the passes of ``probes`` read."""
    return {p.implementation.needle_kind for p in passes_for(probes)} - {None}
