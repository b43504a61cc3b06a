"""headprobe: profile attention heads and layers, allocate KV-cache budgets, apply them in generate.

The public API, grouped by stage: each name and the module that defines it (``"module:attribute"`` where
the public name differs). It is what a user calls: load a model, profile, allocate, generate, evaluate, tune,
explain, plot, import and export, and the file types. What a command line needs besides (flag-value
parsers, the checks of a command's outputs before a model loads, atomic writes) is :mod:`headprobe.frontend`.
Names are imported on first use (PEP 562), so ``import headprobe`` loads neither torch, transformers nor
matplotlib; using a name that needs them loads them. The one module imported here is the probe registry
(standard library only): it registers the built-in passes' profile kinds with the profile file type
(:mod:`headprobe.profile_kinds`) before any profile is read.
"""

from __future__ import annotations

from .lazy_exports import lazy_exports
from .probes import registry as _probe_registry  # noqa: F401  (registers the built-in passes' profile kinds)

__version__ = "0.1.0"

_API: dict[str, dict[str, str]] = {
    # errors that reach a user as one line
    "errors": {
        "HeadprobeError": "errors",
        "FileFormatError": "errors",
        "ModelMismatchError": "errors",
        "NoPassingTrialsError": "errors",
    },
    # models: aliases, loading, the identity every file records
    "models": {
        "DEFAULT_MODEL": "models.registry",
        "MODELS": "models.registry",
        "ModelSpec": "models.registry",
        "DTYPES": "models.loading",
        "LoadedModel": "models.loading",
        "load_model": "models.loading",
        "model_identity": "models.loading",
        "resolve_model": "models.loading",
        "ModelIdentity": "models.identity",
        "input_device": "models.placement",
    },
    # files: trial logs, any headprobe file by its format
    "files": {
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
        "shipped_needle_file": "haystack.needles",
        "load_tasks": "haystack.tasks",
        "PROMPT_FORMATS": "haystack.prompt_format",
    },
    # profiling: needle probes and layer retention, written as profiles
    "profiling": {
        "PROBES": "probes.registry",
        "ProfileRequest": "probes.request",
        "ProfileResult": "probes.run",
        "ProfileOutputs": "probes.outputs",
        "merge_profile_logs": "probes.run",
        "MODES": "probes.modes",
        "StopRule": "probes.early_stop",
        "GATES": "probes.gates",
        "run_profile": "probes.run",
        "check_profile_run": "probes.plan",
        "RetentionConfig": "probes.retention",
        "PROFILE_KINDS": "profile_kinds",
        "HEAD_SCORE_KINDS": "profile_kinds",
        "read_contexts": "haystack.contexts",
        "ContextFields": "haystack.qa_data",
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
        "clamp_and_redistribute": "budget_arithmetic",
        "BudgetMap": "budget_map",
        "LayerSplit": "layer_split",
        "choose_layer_split": "allocation.layer_split_choice",
        "layer_scores": "allocation.layer_split_choice",
        "split_budget_map": "allocation.layer_split_choice",
    },
    # tool_files: files other tools read and write (head scores, attention patterns, budget lists)
    "tool_files": {
        "IMPORT_FORMATS": "tool_files.auto",
        "import_file": "tool_files.auto",
        "write_duoattention": "tool_files.duoattention",
        "write_headkv_json": "tool_files.headkv_json",
        "identity_for_model": "tool_files.known",
        "write_layer_list": "tool_files.layer_list",
        "write_kvpress_ratios": "tool_files.layer_list",
        "write_engine_split": "tool_files.engine_windows",
    },
    # runtime: the compressed KV cache inside generate
    "runtime": {
        "MapBudget": "runtime.budget_sources",
        "SplitBudget": "runtime.split_budget",
        "load_budget_file": "runtime.split_budget",
        "RatioBudget": "runtime.budget_sources",
        "UniformBudget": "runtime.budget_sources",
        "CompressedCache": "runtime.cache",
        "headprobe_attention": "runtime.cache",
        "GenerationResult": "runtime.generate",
        "generate_compressed": "runtime.generate",
        "make_policy": "runtime.generate",
        "set_kernel_backend": "runtime.kernels.dispatch",
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
        "CacheSetting": "runtime.settings_batch",
        "SettingGeneration": "runtime.settings_batch",
        "generate_settings": "runtime.settings_batch",
    },
    # evaluation: needle / bAbI-style grids, outside QA datasets, head ablation
    "evaluation": {
        "HeadAblation": "eval.ablation",
        "format_ablation": "eval.ablation",
        "random_heads": "eval.ablation",
        "run_ablation": "eval.ablation",
        "BABI_TASKS": "eval.babi",
        "generate_questions": "eval.babi",
        "load_qa_dataset": "eval.datasets",
        "run_dataset_eval": "eval.datasets",
        "LongBenchQA": "eval.answer_tasks",
        "load_ruler_dir": "eval.ruler_data",
        "RulerGeneration": "eval.ruler_generate",
        "check_ruler_generation": "eval.ruler_generate",
        "generate_ruler": "eval.ruler_generate",
        "RulerTask": "eval.ruler_task",
        "format_ruler_scores": "eval.ruler_task",
        "ratio_capacities": "eval.ruler_task",
        "ruler_points": "eval.ruler_task",
        "ruler_scores": "eval.ruler_task",
        "EvalItem": "eval.items",
        "items_from_babi": "eval.items",
        "items_from_longgen": "eval.items",
        "items_from_needles": "eval.items",
        "EvalResult": "eval.result",
        "format_eval_summary": "eval.result",
        "EvalRequest": "eval.runner",
        "run_eval": "eval.runner",
        "EVAL_PRESETS": "eval.settings",
        "EvalSetting": "eval.settings",
        "expand_settings": "eval.settings",
        "expand_specs": "eval.settings",
        "parse_setting": "eval.settings",
        "parse_settings": "eval.settings",
        "SettingSpec": "eval.settings",
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
    },
    # tune: the setting that keeps the most accuracy at a memory, searched on calibration items, reported held out
    "tune": {
        "TuneRequest": "tune.request",
        "TuneTask": "tune.request",
        "run_tune": "tune.runner",
        "SearchSpace": "tune.space",
        "count_candidates": "tune.space",
        "TrialPlan": "tune.plan",
        "plan_trials": "tune.plan",
        "split_items": "tune.split",
        "HalvingRule": "tune.halving",
        "MemoryTarget": "tune.memory",
        "capacity_for": "tune.memory",
        "write_tune_outputs": "tune.report",
        "format_tune_report": "tune.report",
        "load_tune_report": "tune.report",
        "tune_figure": "tune.figure",
    },
    # explain: any budget in tokens and bytes, and what every engine allocates for it
    "explain": {"explain_budget": "explain.api", "save_explain_figure": "explain.figure",
                "format_explanation": "explain.report"},
    # plots of every stage (PNG or SVG)
    "plots": {
        "ablation_bars": "plots.eval_figures",
        "accuracy_vs_memory": "plots.eval_figures",
        "ruler_vs_memory": "plots.eval_figures",
        "needle_grid": "plots.eval_figures",
        "PLOT_FORMATS": "plots.profile_figures",
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
