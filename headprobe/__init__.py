"""headprobe: profile attention heads and layers, allocate KV-cache budgets, apply them in generate.

The public API, grouped by stage: each name and the module that defines it (``"module:attribute"`` where
the public name differs). Names are imported on first use (PEP 562), so ``import headprobe`` loads
neither torch, transformers nor matplotlib; using a name that needs them loads them.
"""

from __future__ import annotations

from .lazy_exports import lazy_exports

__version__ = "0.1.0"

_API: dict[str, dict[str, str]] = {
    # errors that reach a user as one line, and how their messages spell parameters
    "errors": {
        "HeadprobeError": "errors",
        "FileFormatError": "errors",
        "ModelMismatchError": "errors",
        "NoPassingTrialsError": "errors",
        "param": "errors",
        "flag_spelling": "errors",
        "MAX_TOKENS": "limits",
        "check_count": "limits",
    },
    # models: aliases, loading, the identity every file records
    "models": {
        "DEFAULT_MODEL": "models.registry",
        "MODELS": "models.registry",
        "ModelSpec": "models.registry",
        "model_slug": "models.registry",
        "DTYPES": "models.loading",
        "LoadedModel": "models.loading",
        "load_model": "models.loading",
        "model_identity": "models.loading",
        "resolve_model": "models.loading",
        "ModelIdentity": "models.identity",
        "input_device": "models.placement",
        "parse_max_memory": "models.placement",
    },
    # files: JSON written atomically, trial logs, overwrite checks, any headprobe file by its format
    "files": {
        "atomic_write_json": "files.jsonio",
        "check_writable_dir": "files.jsonio",
        "read_json": "files.jsonio",
        "check_overwrite": "files.overwrite",
        "read_log": "files.trial_log",
        "user_profiles_dir": "paths",
        "load_file": "file_summary",
        "summarize_file": "file_summary",
    },
    # haystacks: corpus text, needles, layer-retention task prompts
    "haystacks": {
        "load_haystack": "haystack.corpus",
        "Needle": "haystack.needles",
        "load_needles": "haystack.needles",
        "check_needle_files": "haystack.needles",
        "shipped_needle_file": "haystack.needles",
        "load_tasks": "haystack.tasks",
    },
    # profiling: needle probes and layer retention, written as profiles
    "profiling": {
        "PROBES": "probes.run",
        "ProfileRequest": "probes.run",
        "ProfileResult": "probes.run",
        "ProfileOutputs": "probes.run",
        "check_profile_run": "probes.run",
        "merge_profile_logs": "probes.run",
        "needle_kinds": "probes.run",
        "MODES": "probes.modes",
        "StopRule": "probes.early_stop",
        "DEFAULT_RECOMPUTE_SHARE": "probes.modes",
        "parse_recompute_share": "probes.modes",
        "GATES": "probes.gates",
        "choose_gate": "probes.gates",
        "run_profile": "probes.run",
        "RetentionConfig": "probes.retention",
        "probe_grid": "probes:trial_grid",
        "PROFILE_KINDS": "profile",
        "LayerRetention": "profile",
        "Profile": "profile",
        "reduce_groups": "profile",
        "top_heads": "head_ranking",
    },
    # allocation: profiles → per-head budget maps
    "allocation": {
        "ALLOCATORS": "allocation.registry",
        "Allocator": "allocation.allocator",
        "CapacityOptions": "allocation.options",
        "allocate": "allocation.api",
        "load_profile": "allocation.api",
        "newest_profile": "allocation.api",
        "find_profiles": "allocation.api",
        "profiles_for_method": "allocation.api",
        "summarize": "allocation.api",
        "clamp_and_redistribute": "allocation.clamp",
        "parse_task_mix": "allocation.dynamickv_offline",
        "BudgetMap": "budget_map",
    },
    # interop: other tools' head files and budget lists
    "interop": {
        "IMPORT_FORMATS": "interop.auto",
        "import_file": "interop.auto",
        "write_duoattention": "interop.duoattention",
        "write_headkv_json": "interop.headkv_json",
        "identity_for_model": "interop.known",
        "write_layer_list": "interop.layer_list",
        "write_kvpress_ratios": "interop.layer_list",
    },
    # runtime: the compressed KV cache inside generate
    "runtime": {
        "MapBudget": "runtime.budget_sources",
        "RatioBudget": "runtime.budget_sources",
        "UniformBudget": "runtime.budget_sources",
        "CompressedCache": "runtime.cache",
        "headprobe_attention": "runtime.cache_attention",
        "GenerationResult": "runtime.generate",
        "generate_compressed": "runtime.generate",
        "make_policy": "runtime.generate",
        "parse_policy_options": "runtime.generate",
        "set_kernel_backend": "runtime.kernels.dispatch:set_backend",
        "POLICIES": "runtime.policies",
        "Policy": "runtime.policies.base",
        "DynamicKV": "runtime.policies.dynamickv",
        "Full": "runtime.policies.full",
        "KeepKV": "runtime.policies.keepkv",
        "KeyDiff": "runtime.policies.keydiff",
        "MorphKV": "runtime.policies.morphkv",
        "SnapKV": "runtime.policies.snapkv",
        "Streaming": "runtime.policies.streaming",
        "RecordedPrefill": "runtime.shared_prefill",
        "generate_from_prefill": "runtime.shared_prefill",
        "record_prefill": "runtime.shared_prefill",
    },
    # evaluation: needle / bAbI-style grids, outside QA datasets, head ablation
    "evaluation": {
        "HeadAblation": "eval.ablation",
        "ablation_log_path": "eval.ablation",
        "check_ablation_outputs": "eval.ablation",
        "format_ablation": "eval.ablation",
        "random_heads": "eval.ablation",
        "run_ablation": "eval.ablation",
        "BABI_TASKS": "eval.babi:TASKS",
        "generate_questions": "eval.babi",
        "load_qa_dataset": "eval.datasets",
        "run_dataset_eval": "eval.datasets",
        "EvalItem": "eval.items",
        "items_from_babi": "eval.items",
        "items_from_longgen": "eval.items",
        "items_from_needles": "eval.items",
        "EvalResult": "eval.result",
        "format_eval_summary": "eval.result:format_summary",
        "EvalRequest": "eval.runner",
        "cell_log_path": "eval.cell_log",
        "check_eval_outputs": "eval.cell_log",
        "run_eval": "eval.runner",
        "EVAL_PRESETS": "eval.settings:PRESETS",
        "EvalSetting": "eval.settings",
        "expand_settings": "eval.settings",
        "parse_setting": "eval.settings",
        "split_capacities": "eval.settings",
        "MAP_ALLOCATION": "eval.settings",
        "resolve_budget": "eval.runner",
    },
    # data parallel over torchrun's ranks: a slice of the work each, merged at rank 0
    "distributed": {
        "Ranks": "distributed.ranks",
        "process_group": "distributed.ranks",
        "ranks_from_env": "distributed.ranks",
        "run_profile_on_ranks": "distributed.profile_ranks",
        "check_profile_run_on_ranks": "distributed.profile_ranks",
        "run_eval_on_ranks": "distributed.eval_ranks",
        "run_dataset_eval_on_ranks": "distributed.eval_ranks",
        "run_ablation_on_ranks": "distributed.ablation_ranks",
        "share_from_main": "distributed.tune_ranks",
    },
    # tune: the setting that keeps the most accuracy at a memory, searched on calibration items, reported held out
    "tune": {
        "TuneRequest": "tune.runner",
        "TuneTask": "tune.runner",
        "run_tune": "tune.runner",
        "SearchSpace": "tune.space",
        "parse_tune_values": "tune.space:parse_values",
        "count_candidates": "tune.space",
        "HalvingRule": "tune.halving",
        "split_items": "tune.split",
        "MemoryTarget": "tune.memory",
        "capacity_for": "tune.memory",
        "cache_dtype": "tune.memory",
        "parse_bytes": "tune.memory",
        "parse_share": "tune.memory",
        "check_tune_outputs": "tune.report",
        "write_tune_outputs": "tune.report:write_outputs",
        "format_tune_report": "tune.report:format_report",
        "load_tune_report": "tune.report:load_report",
        "tune_figure": "tune.figure",
    },
    # explain: any budget in tokens and bytes, and what every engine allocates for it
    "explain": {"explain_budget": "explain.api", "model_shape": "explain.model_shape"},
    # plots of every stage (PNG or SVG)
    "plots": {
        "ablation_bars": "plots.eval_figures",
        "accuracy_vs_memory": "plots.eval_figures",
        "needle_grid": "plots.eval_figures",
        "PLOT_FORMATS": "plots.profile_figures:FORMATS",
        "budget_heatmap": "plots.profile_figures",
        "compare_heatmaps": "plots.profile_figures",
        "head_heatmap": "plots.profile_figures",
        "retention_curves": "plots.profile_figures",
        "save_figure": "plots.profile_figures",
        "stability_figure": "plots.stability",
    },
}

__getattr__, __dir__, __all__ = lazy_exports(
    __name__, {name: module for stage in _API.values() for name, module in stage.items()}, eager=("__version__",))
