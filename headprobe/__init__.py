"""headprobe: profile attention heads and layers, allocate KV-cache budgets, apply them in generate."""

from .budget_map import BudgetMap
from .errors import FileFormatError, HeadprobeError, ModelMismatchError, NoPassingTrialsError
from .models import (
    DEFAULT_MODEL,
    MODELS,
    LoadedModel,
    ModelIdentity,
    load_model,
    model_identity,
    resolve_model,
)
from .profile import LayerRetention, Profile, reduce_groups

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "MODELS",
    "BudgetMap",
    "FileFormatError",
    "HeadprobeError",
    "LayerRetention",
    "LoadedModel",
    "ModelIdentity",
    "ModelMismatchError",
    "NoPassingTrialsError",
    "Profile",
    "__version__",
    "load_model",
    "model_identity",
    "reduce_groups",
    "resolve_model",
]

# allocation and interop (budget maps, other tools' files)
from .allocation import allocate, clamp_and_redistribute, newest_profile, summarize
from .interop import import_file

__all__ += ["allocate", "clamp_and_redistribute", "import_file", "newest_profile", "summarize"]

# profiling (needle probes, layer retention, trial logs)
from .files.trial_log import read_log
from .haystack import Needle, load_haystack, load_needles, load_tasks
from .probes import trial_grid as probe_grid
from .probes.early_stop import StopRule
from .probes.retention import RetentionConfig
from .probes.reuse_mode import DEFAULT_RECOMPUTE_SHARE, parse_recompute_share
from .probes.run import MODES, PROBES, ProfileRequest, ProfileResult, merge_profile_logs, run_profile

__all__ += [
    "DEFAULT_RECOMPUTE_SHARE",
    "MODES",
    "PROBES",
    "Needle",
    "ProfileRequest",
    "ProfileResult",
    "RetentionConfig",
    "StopRule",
    "load_haystack",
    "load_needles",
    "load_tasks",
    "merge_profile_logs",
    "parse_recompute_share",
    "probe_grid",
    "read_log",
    "run_profile",
]
from .file_summary import summarize_file

__all__ += ["summarize_file"]

# runtime (compressed KV cache inside generate)
from .runtime import (
    POLICIES,
    CompressedCache,
    GenerationResult,
    MapBudget,
    Policy,
    RatioBudget,
    RecordedPrefill,
    UniformBudget,
    generate_compressed,
    generate_from_prefill,
    headprobe_attention,
    make_policy,
    parse_policy_options,
    record_prefill,
    set_kernel_backend,
)
from .runtime.policies import DynamicKV, Full, KeepKV, KeyDiff, MorphKV, SnapKV, Streaming

__all__ += [
    "POLICIES",
    "CompressedCache",
    "DynamicKV",
    "Full",
    "GenerationResult",
    "KeepKV",
    "KeyDiff",
    "MapBudget",
    "MorphKV",
    "Policy",
    "RatioBudget",
    "RecordedPrefill",
    "SnapKV",
    "Streaming",
    "UniformBudget",
    "generate_compressed",
    "generate_from_prefill",
    "headprobe_attention",
    "make_policy",
    "parse_policy_options",
    "record_prefill",
    "set_kernel_backend",
]

# evaluation (needle / bAbI-style grids, outside QA datasets, head ablation)
from .eval import (
    BABI_TASKS,
    EvalItem,
    EvalRequest,
    EvalResult,
    EvalSetting,
    HeadAblation,
    cell_log_path,
    expand_settings,
    format_ablation,
    generate_questions,
    items_from_babi,
    items_from_longgen,
    items_from_needles,
    load_qa_dataset,
    random_heads,
    run_ablation,
    run_dataset_eval,
    run_eval,
    top_heads,
)
from .eval import PRESETS as EVAL_PRESETS
from .eval import format_summary as format_eval_summary
from .files.jsonio import atomic_write_json, check_writable_dir
from .files.overwrite import check_overwrite
from .haystack.needles import shipped_needle_file
from .models import model_slug
from .plots import ablation_bars, accuracy_vs_memory, needle_grid, save_figure, stability_figure

__all__ += [
    "BABI_TASKS",
    "EVAL_PRESETS",
    "EvalItem",
    "EvalRequest",
    "EvalResult",
    "EvalSetting",
    "HeadAblation",
    "ablation_bars",
    "accuracy_vs_memory",
    "atomic_write_json",
    "cell_log_path",
    "check_overwrite",
    "check_writable_dir",
    "expand_settings",
    "format_ablation",
    "format_eval_summary",
    "generate_questions",
    "items_from_babi",
    "items_from_longgen",
    "items_from_needles",
    "load_qa_dataset",
    "model_slug",
    "needle_grid",
    "random_heads",
    "run_ablation",
    "run_dataset_eval",
    "run_eval",
    "save_figure",
    "shipped_needle_file",
    "stability_figure",
    "top_heads",
]
