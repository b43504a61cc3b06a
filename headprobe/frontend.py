"""What a front end needs besides the public API: the ``headprobe`` command line, or any tool that wraps it.

:mod:`headprobe` is what a user calls (load, profile, allocate, generate, eval, tune, explain, plot, export, the
file types). A front end also parses flag values, checks a command's outputs before the model loads (so a
refusal costs nothing), writes files atomically without replacing a user's file, and works out a command's
plan (its grid, the profiles it will read, the model's shape from its config). Those helpers are here, named
and grouped like the public API: the command line uses the names of :mod:`headprobe` and of this module and
nothing else (it imports each from the module that defines it, so that tools can follow the call; a test
checks that every such name is one of these). Names are imported on first use, as in :mod:`headprobe`.
"""

from __future__ import annotations

from .lazy_exports import lazy_exports

_FRONTEND: dict[str, dict[str, str]] = {
    # flag values: parsing, checking and how a message spells a parameter (--flag on the command line, name= in Python)
    "arguments": {
        "flag_spelling": "errors",
        "check_count": "limits",
        "parse_max_memory": "models.placement",
        "DEFAULT_RECOMPUTE_SHARE": "probes.modes",
        "parse_recompute_share": "probes.modes",
        "parse_policy_options": "runtime.generate",
        "parse_tune_values": "tune.space",
        "parse_bytes": "sizes",
        "parse_share": "sizes",
        "split_capacities": "eval.settings",
        "check_allocator_options": "allocation.registry",
        "resolve_prompt_format": "haystack.prompt_format",
        "wants_chat_template": "haystack.prompt_format",
    },
    # what a command writes: checked before the model loads, never overwritten without --force, written atomically
    "outputs": {
        "atomic_write_json": "files.jsonio",
        "check_writable_dir": "files.jsonio",
        "write_folder_atomically": "files.atomic",
        "read_json": "files.jsonio",
        "check_overwrite": "files.overwrite",
        "model_slug": "models.registry",
        "ablation_log_path": "eval.ablation",
        "check_ablation_outputs": "eval.ablation",
        "cell_log_path": "eval.cell_log",
        "check_eval_outputs": "eval.cell_log",
        "check_tune_outputs": "tune.report",
    },
    # what a command works out before or after loading the model: grids, needle kinds, profiles found, splits, shapes
    "plans": {
        "trial_grid": "probes",
        "needle_kinds": "probes.inputs",
        "context_probes": "probes.context_pass",
        "tune_profiles": "tune.candidates",
        "check_tune_space": "tune.space_check",
        "ShapeOnly": "tune.space_check",
        "cache_dtype": "tune.memory",
        "model_shape": "explain.model_shape",
        "MAP_ALLOCATION": "eval.settings",
        "resolve_budget": "eval.runner",
    },
}

__getattr__, __dir__, __all__ = lazy_exports(
    __name__, {name: module for group in _FRONTEND.values() for name, module in group.items()},
    modules_of=__package__)
