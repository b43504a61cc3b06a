"""The grid runner: every setting × length × depth cell, every item in each cell, logged cell by cell.

:func:`run_eval` goes in named steps: check the request, resolve every setting's budget
(:func:`resolve_budgets`), check the prompt lengths (:class:`GridPrompts`) and the question windows
(:func:`check_question_windows`), open or resume the cell log
(:func:`open_cell_log`), then for each (length, depth) run the cells not yet finished together
(:func:`run_cell_group`, one shared prompt forward per item) and log them (:mod:`headprobe.eval.cell_log`:
the result JSON is rewritten atomically after each group). An interrupted run resumes from the last
finished cell and never redoes one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..allocation.api import allocate, load_profile, newest_profile
from ..allocation.options import spelled_as_setting_options
from ..errors import HeadprobeError, param
from ..haystack.context import TrialContext, build_context
from ..haystack.corpus import Haystack
from ..haystack.prompt_format import prompt_format_of
from ..library_bridges.press_settings import KVPRESS
from ..limits import check_count
from ..runtime.policies import POLICIES
from ..runtime.shared_prefill import record_prefill
from .answer_scores import score_answer
from .cell_log import CellLog, cell_id, cell_record
from .items import EvalItem
from .result import EvalResult
from .setting_run import SettingRun, run_setting, run_settings, shares_prefill
from .settings import MAP_ALLOCATION, EvalSetting, load_setting_map

if TYPE_CHECKING:
    from ..models.identity import HasIdentity
    from ..models.loading import LoadedModel


@dataclass
class EvalRequest:
    """What to run.

    Attributes
    ----------
    settings
        From :func:`headprobe.eval.settings.expand_settings`.
    items
        The questions asked in every cell.
    lengths, depths
        The grid: prompt lengths in tokens, needle depths in [0, 1].
    haystack
        The text the needles are hidden in.
    task
        Description written into the result (kind, needle file, fingerprints).
    chat_template
        Render prompts with the tokenizer's chat template when it has one; otherwise (and for a model
        without one) the plain form that ends with the answer cue (:mod:`headprobe.haystack.prompt_format`).
        The result and its cell log record which (``prompt_format``).
    share_prefill
        Run each prompt's forward once for every setting whose policy prefills with plain attention
        (:mod:`headprobe.runtime.shared_prefill`; same answers and bytes, far less time); KeyDiff's
        block-wise prefill always runs on its own.
    budgets
        Budgets already resolved (:func:`resolve_budgets`) by setting label, for this model and ``profile_dirs``
        (a tune resolves each setting once as it checks it): a setting found here is not resolved again.
    """

    settings: list[EvalSetting]
    items: list[EvalItem]
    lengths: list[int]
    depths: list[float]
    haystack: Haystack
    task: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 24
    chat_template: bool = True
    profile_dirs: list[Path] | None = None
    share_prefill: bool = True
    budgets: Mapping[str, Any] | None = None


def resolve_budget(lm: HasIdentity, setting: EvalSetting, profile_dirs: list[Path] | None = None,
                   window: int | None = None) -> Any:
    """The ``budget`` argument of :func:`generate_compressed` for a setting: a capacity or a budget map.

    A budget map is allocated for the observation window the setting's policy runs with (``window``, by
    default the setting's own), so every head's floor holds that window: HeadKV's floor is
    ``window + (b - b // beta)`` with ``b = capacity - window``, PyramidKV's and the combined map's
    ``window``, and a map allocated for 8 tokens is never run with 32. The setting's allocation options
    (``beta``, ``taper``, ...) are the allocator's; its messages name them as setting options.

    Raises
    ------
    HeadprobeError
        A profile that is missing or made for another model, a capacity the allocator refuses (one no
        larger than the window), an allocation option it refuses, or a map per query head.
    """
    if setting.capacity is None:
        return None
    if setting.policy == KVPRESS:       # the press keeps the capacity; kvpress places it
        return setting.capacity
    if window is None:
        window = setting.window()
        if not isinstance(window, int):
            raise HeadprobeError(f"setting {setting.label}: its window is set per prompt; pass the window to "
                                 "allocate for")
    if setting.allocation == MAP_ALLOCATION:
        return map_budget(lm, setting, int(window))
    if setting.allocation in (None, "uniform"):
        if POLICIES[setting.policy].uses_budgets and setting.capacity < window:
            raise HeadprobeError(f"setting {setting.label}: a capacity of {setting.capacity} tokens per head is "
                                 f"smaller than the {setting.policy} window ({window} tokens)")
        return setting.capacity
    profiles = []
    for p in setting.profiles:
        if Path(p).is_file():
            profiles.append(load_profile(p))
        else:
            profiles.append(newest_profile(lm.identity, p, profile_dirs).profile)
    try:
        with spelled_as_setting_options():
            bm = allocate(setting.allocation, profiles, lm.identity, capacity=setting.capacity, window=int(window),
                          **setting.allocation_options)
    except HeadprobeError as exc:
        raise HeadprobeError(f"setting {setting.label}: {exc}") from None
    if bm.granularity != "kv_head":
        raise HeadprobeError(f"setting {setting.label}: the map is allocated per query head (compat=headkv); the "
                             "cache keeps budgets per KV head")
    return bm


def map_budget(lm: HasIdentity, setting: EvalSetting, window: int) -> Any:
    """The budget map of a ``POLICY:FILE.json`` setting, run as it is (its own capacity), once checked: it
    fits the model and every head it caches holds the policy's window.

    Raises
    ------
    HeadprobeError
        A map made for another model, or a head budget smaller than the window.
    """
    bm = load_setting_map(setting.profiles[0], setting.name)
    try:
        bm.check_fits(lm.identity, what=f"budget map {setting.profiles[0]}")      # its trials do not check it again
    except HeadprobeError as exc:
        raise HeadprobeError(f"setting {setting.label}: {exc}") from None
    cached = [i for i, t in enumerate(lm.identity.layer_types) if t != "sliding_attention"]
    smallest = min(min(bm.budgets[i]) for i in cached)
    if POLICIES[setting.policy].uses_budgets and smallest < window:
        raise HeadprobeError(f"setting {setting.label}: the map gives a head {smallest} tokens, fewer than the "
                             f"{setting.policy} window ({window} tokens); allocate the map for that window")
    return bm


@dataclass
class WindowBudgets:
    """The budgets of a setting whose window is the question (``window=question``): one per window size
    met, each allocated for that window (:func:`resolve_budget`) on first use.

    Call it with a window to get the budget.
    """

    lm: HasIdentity
    setting: EvalSetting
    profile_dirs: list[Path] | None = None
    by_window: dict[int, Any] = field(default_factory=dict)

    def __call__(self, window: int) -> Any:
        if window not in self.by_window:
            cap = self.setting.capacity
            if cap is not None and window > cap:
                raise HeadprobeError(f"setting {self.setting.label}: a question window of {window} tokens does not "
                                     f"fit a capacity of {cap} tokens per head")
            self.by_window[window] = resolve_budget(self.lm, self.setting, self.profile_dirs, window)
        return self.by_window[window]


def resolve_budgets(lm: HasIdentity, settings: list[EvalSetting], profile_dirs: list[Path] | None = None,
                    known: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every setting's budget by label (:func:`resolve_budget`), so a bad setting fails before any trial; a
    setting with a question window gets a :class:`WindowBudgets` (checked with :func:`check_question_windows`).
    A setting whose label is in ``known`` (budgets resolved before, for the same model and ``profile_dirs``)
    keeps that budget: each is resolved once."""
    known = known or {}
    return {s.label: known[s.label] if s.label in known else
            WindowBudgets(lm, s, profile_dirs) if s.question_window else resolve_budget(lm, s, profile_dirs)
            for s in settings}


def trial_setting(setting: EvalSetting, budget: Any, context: TrialContext) -> tuple[EvalSetting, Any]:
    """The setting and budget one trial runs with: a question window becomes the prompt's
    :attr:`~headprobe.haystack.context.TrialContext.question_window` and its budget is allocated for it."""
    if not setting.question_window:
        return setting, budget
    window = context.question_window
    return setting.with_window(window), budget(window)


def run_trial(lm: LoadedModel, context: TrialContext, item: EvalItem, setting: EvalSetting, budget: Any,
              max_new_tokens: int, prefill: Any = None, reference: str | None = None,
              run: SettingRun | None = None) -> dict[str, Any]:
    """One trial: the answer under the setting's cache, its score, bytes and time.

    ``run`` is the answer when it was generated already (:func:`run_item`, which decodes an item's settings
    together); without it the answer is generated here (:func:`~headprobe.eval.setting_run.run_setting`).
    With ``prefill`` (a :class:`~headprobe.runtime.shared_prefill.RecordedPrefill` of this prompt) the prompt forward is
    not run again; the time reported still includes it, as if this setting had run alone. ``reference``
    is the full cache's answer, which ``fidelity`` items are scored against; the ``full`` setting's own
    answer is that reference when none is given.
    """
    if run is None:
        span = context.question_span if setting.policy == KVPRESS else None
        run = run_setting(lm, context.input_ids, setting, budget, max_new_tokens, prefill, span,
                          stop_at_line=stops_at_line(item))
    text = run.text
    extra: dict[str, Any] = {}
    if item.scorer == "fidelity":
        if reference is None and setting.policy == "full":
            reference = text
        if reference is None:
            raise HeadprobeError(f"item {item.id}: fidelity scoring needs the full cache's answer")
        extra = {"reference": reference, "needle_recall": round(score_answer(text, item.gold, "rouge"), 4)}
        score = score_answer(text, reference, "fidelity")
    else:
        score = score_answer(text, item.gold, item.scorer, item.choices)
    return {
        "item": item.id, "prompt_len": context.length, "answer_span": list(context.answer_span),
        "actual_depth": round(context.actual_depth, 4), "response": text, "gold": item.gold,
        "score": score, **extra, **run.measurements(),
    }


def stops_at_line(item: EvalItem) -> bool:
    """Whether an answer to ``item`` can end at its first line break: its scorer reads only the first line
    (``exact``), so nothing written after it changes the score."""
    return item.scorer == "exact"


def run_item(lm: LoadedModel, context: TrialContext, item: EvalItem, runs: list[tuple[EvalSetting, Any]],
             max_new_tokens: int, prefill: Any = None) -> list[dict[str, Any]]:
    """Every setting's trial on one prompt: the settings ``prefill`` serves decode together
    (:func:`~headprobe.eval.setting_run.run_settings`), then each answer is scored (:func:`run_trial`).

    ``runs``: ``(setting, budget)`` pairs as the trial runs them (:func:`trial_setting`). A ``fidelity`` item
    is scored against the full cache's answer: the ``full`` setting's, or a reference run's when no setting
    is the full cache. Returns one trial per pair, in order.
    """
    reference_run = item.scorer == "fidelity" and not any(s.policy == "full" for s, _ in runs)
    asked = [(EvalSetting("reference", "full"), None)] * reference_run + list(runs)
    made = run_settings(lm, context.input_ids, asked, max_new_tokens, prefill, context.question_span,
                        stop_at_line=stops_at_line(item))
    reference = made[0].text if reference_run else None
    full = next((m for (s, _), m in zip(asked, made, strict=True) if s.policy == "full"), None)
    if item.scorer == "fidelity" and reference is None and full is not None:
        reference = full.text
    answered = made[reference_run:]
    return [run_trial(lm, context, item, s, budget, max_new_tokens, prefill=prefill, reference=reference, run=run)
            for (s, budget), run in zip(runs, answered, strict=True)]


class GridPrompts:
    """The prompts of a grid: one :class:`~headprobe.haystack.context.TrialContext` per (item, length,
    depth), built on first use and kept.

    Raises
    ------
    HeadprobeError
        From :meth:`check_lengths` or a call: a length beyond the model's context or the haystack.
    """

    def __init__(self, lm: LoadedModel, request: EvalRequest) -> None:
        self.lm, self.request = lm, request
        self._contexts: dict[tuple[str, int, float], TrialContext] = {}

    def __call__(self, item: EvalItem, length: int, depth: float) -> TrialContext:
        key = (item.id, length, depth)
        if key not in self._contexts:
            req = self.request
            self._contexts[key] = build_context(self.lm.tokenizer, req.haystack, item.needle, length, depth,
                                                req.chat_template, self.lm.identity.max_context,
                                                question=item.question)
        return self._contexts[key]

    def check_lengths(self) -> None:
        """Build one prompt of every length: fail before any trial on lengths the model or haystack cannot hold."""
        for length in self.request.lengths:
            self(self.request.items[0], length, self.request.depths[0])


def check_question_windows(request: EvalRequest, prompts: GridPrompts, budgets: dict[str, Any]) -> None:
    """Before any trial: every item's question window fits every question-window setting's capacity (and
    its allocation), measured on the item's prompt at the first length and depth.

    Raises
    ------
    HeadprobeError
        A question longer than a setting's capacity, or an allocation that refuses its window.
    """
    settings = [s for s in request.settings if s.question_window]
    if not settings:
        return
    for item in request.items:
        window = prompts(item, request.lengths[0], request.depths[0]).question_window
        for s in settings:
            try:
                budgets[s.label](window)
            except HeadprobeError as exc:
                raise HeadprobeError(f"{exc} (item {item.id})") from None


def check_request(request: EvalRequest) -> None:
    """Refuse a grid with nothing to ask or no cell.

    Raises
    ------
    HeadprobeError
        No items, no lengths or no depths.
    """
    if not request.items:
        raise HeadprobeError("no questions to ask: the item list is empty")
    if not request.lengths or not request.depths:
        raise HeadprobeError(f"{param('lengths')} and {param('depths')}: give at least one of each")
    check_count("max_new_tokens", request.max_new_tokens)


def open_cell_log(lm: LoadedModel, request: EvalRequest, out: str | Path, resume: bool = False,
                  force: bool = False, figures: Sequence[str | Path] = ()) -> CellLog:
    """The grid's :class:`~headprobe.eval.cell_log.CellLog`, with what a resumed grid must share; the log
    and the result record the prompt form (``prompt_format``: ``"chat"`` or ``"plain"``)."""
    form = prompt_format_of(lm.tokenizer, request.chat_template)
    log_settings = {"haystack": request.haystack.fingerprint, "items": [i.id for i in request.items],
                    "lengths": list(request.lengths), "depths": list(request.depths),
                    "max_new_tokens": request.max_new_tokens, "chat_template": request.chat_template,
                    "prompt_format": form}
    grid = {"lengths": list(request.lengths), "depths": list(request.depths)}
    cells = CellLog(lm, out, request.task, grid, request.settings, log_settings, resume=resume, force=force,
                    figures=figures)
    cells.result.extra["prompt_format"] = form
    return cells


def run_cell_group(lm: LoadedModel, request: EvalRequest, prompts: GridPrompts, settings: list[EvalSetting],
                   budgets: dict[str, Any], length: int, depth: float,
                   progress: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """Run the cells of ``settings`` at one (length, depth): every item under every setting.

    Items outer, settings inner: when more than one setting prefills with plain attention (and
    ``request.share_prefill``), one recorded prompt forward per item serves them all. The full cache runs
    first, so its answer is the reference of ``fidelity`` items; when no setting is the full cache and an
    item needs one, a full-cache reference run comes first.

    Returns
    -------
    list of dict
        One :func:`~headprobe.eval.cell_log.cell_record` per setting, in the order of ``settings``.
    """
    share = request.share_prefill and sum(shares_prefill(s) for s in settings) > 1
    trials: dict[str, list[dict[str, Any]]] = {s.label: [] for s in settings}
    full_first = sorted(settings, key=lambda s: s.policy != "full")
    for item in request.items:
        ctx = prompts(item, length, depth)
        prefill = record_prefill(lm, input_ids=torch.tensor([ctx.input_ids])) if share else None
        runs = [trial_setting(s, budgets[s.label], ctx) for s in full_first]
        if prefill is None:       # one setting at a time, each answer generated in its trial
            done = []
            reference = None
            if item.scorer == "fidelity" and not any(s.policy == "full" for s in settings):
                reference = run_trial(lm, ctx, item, EvalSetting("reference", "full"), None, request.max_new_tokens)[
                    "response"]
            for run_as, budget in runs:
                done.append(run_trial(lm, ctx, item, run_as, budget, request.max_new_tokens, reference=reference))
                if item.scorer == "fidelity" and reference is None:
                    reference = done[-1]["response"]
        else:
            done = run_item(lm, ctx, item, runs, request.max_new_tokens, prefill)
        for s, (run_as, _), trial in zip(full_first, runs, done, strict=True):
            if s.question_window:
                trial["window"] = run_as.options["window"]
            trials[s.label].append(trial)
            if progress:
                progress(1)
        del prefill
    return [cell_record(s, length, depth, trials[s.label]) for s in settings]


def run_eval(lm: LoadedModel, request: EvalRequest, out: str | Path, resume: bool = False, force: bool = False,
             progress: Callable[[int], None] | None = None, figures: Sequence[str | Path] = (),
             shard: tuple[int, int] | None = None) -> EvalResult:
    """Run the grid and write ``out`` (result JSON) and its cell log.

    Parameters
    ----------
    lm
        A :class:`~headprobe.LoadedModel`.
    request
        Settings, items and grid.
    out
        The result JSON path; the cell log sits beside it (``<stem>.cells.jsonl``).
    resume, force
        Continue an existing cell log (same settings), or start over. With ``force`` the old log and
        result are replaced only once the first new cells are logged.
    progress
        Called with the number of trials just finished (or found finished in the log).
    figures
        Figures the caller will draw from the result: listed in it, checked like ``out``
        (:func:`~headprobe.eval.cell_log.check_eval_outputs`).
    shard
        ``(i, n)``: run only the (length, depth) cell groups ``i, i + n, ...`` of the grid (length outer,
        depth inner); the result says ``"shard": [i, n]`` (:mod:`headprobe.distributed` merges the shards).

    Raises
    ------
    HeadprobeError
        Settings that do not fit the model, lengths beyond its context or the haystack, an existing log
        without ``resume``/``force``, an existing result or figure the run may not replace, a log made
        with other settings, or a log another run writes to.
    """
    check_request(request)
    budgets = resolve_budgets(lm, request.settings, request.profile_dirs, request.budgets)
    prompts = GridPrompts(lm, request)
    prompts.check_lengths()
    check_question_windows(request, prompts, budgets)
    with open_cell_log(lm, request, out, resume=resume, force=force, figures=figures) as cells:
        if shard is not None:
            cells.result.extra["shard"] = list(shard)
        for group, (length, depth) in enumerate((L, d) for L in request.lengths for d in request.depths):
            if shard is not None and group % shard[1] != shard[0]:
                continue
            todo = [s for s in request.settings if not cells.resumed(cell_id(s, length, depth))]
            if progress and len(todo) < len(request.settings):
                progress(len(request.items) * (len(request.settings) - len(todo)))
            if todo:
                cells.add(run_cell_group(lm, request, prompts, todo, budgets, length, depth, progress))
        return cells.finish()
