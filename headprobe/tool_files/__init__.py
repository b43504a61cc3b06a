"""Files other tools read and write: DuoAttention patterns, HeadKV / Retrieval_Head score JSON,
per-layer budget lists."""

from .auto import import_file
from .duoattention import (
    DuoSplit,
    binarise,
    choose_split,
    ranked_pattern,
    read_duoattention,
    read_tsv,
    write_duoattention,
)
from .headkv_json import read_headkv_json, write_headkv_json
from .known import KNOWN_SHAPES, identity_for_model, known_identity
from .layer_list import (
    kvpress_layer_ratios,
    layer_budgets,
    read_layer_list,
    write_kvpress_ratios,
    write_layer_list,
)

__all__ = ["KNOWN_SHAPES", "DuoSplit", "binarise", "choose_split", "identity_for_model", "import_file",
           "known_identity", "kvpress_layer_ratios", "layer_budgets", "ranked_pattern", "read_duoattention", "read_headkv_json",
           "read_layer_list", "read_tsv", "write_duoattention", "write_headkv_json", "write_kvpress_ratios",
           "write_layer_list"]
