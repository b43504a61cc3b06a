"""Files other tools read and write: DuoAttention patterns, HeadKV / Retrieval_Head score JSON,
per-layer budget lists."""

from .auto import import_file
from .duoattention import binarise, read_duoattention, read_tsv, untie, write_duoattention
from .headkv_json import read_headkv_json, write_headkv_json
from .known import KNOWN_SHAPES, identity_for_model, known_identity
from .layer_list import layer_budgets, read_layer_list, write_layer_list

__all__ = ["KNOWN_SHAPES", "binarise", "identity_for_model", "import_file", "known_identity", "layer_budgets",
           "read_duoattention", "read_headkv_json", "read_layer_list", "read_tsv", "untie", "write_duoattention",
           "write_headkv_json", "write_layer_list"]
