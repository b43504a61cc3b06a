"""benchmarks/ruler_kept_tokens.py: which prompt tokens are the gold answer's and the digits, and which
positions each compressed KV head holds."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from headprobe import generate_compressed

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")


def _module():
    spec = importlib.util.spec_from_file_location("ruler_kept_tokens", ROOT / "benchmarks" / "ruler_kept_tokens.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


TEXT = ("One of the special magic numbers for river is: 4821.\nOne of the special magic numbers for mill is: 93.\n"
        "What is the special magic number for mill mentioned in the provided text? The number for mill is 93")


def test_gold_tokens_are_the_gold_number_before_the_question_and_digits_every_number(tiny_llama):
    mod = _module()
    tok = tiny_llama.tokenizer
    ids, gold, digit = mod.token_classes(tok, TEXT, False, "93", TEXT.rfind("What is"))
    pieces = [tok.decode([t]) for t in ids[0].tolist()]
    assert len(pieces) == len(gold) == len(digit)
    assert "".join(p for p, g in zip(pieces, gold) if g).strip() == "93"
    offsets = tok(TEXT, add_special_tokens=False, return_offsets_mapping=True).offset_mapping
    line = TEXT.index("is: 93.")
    assert all(line + 4 <= offsets[i][0] < offsets[i][1] <= line + 6 for i in np.flatnonzero(gold))  # not the answer's 93
    assert "".join(p for p, d in zip(pieces, digit) if d).replace(" ", "") == "4821" + "93" + "93"


def test_kept_masks_are_the_positions_each_head_holds(tiny_llama, tiny_gemma3):
    mod = _module()
    for lm in (tiny_llama, tiny_gemma3):
        ids = lm.tokenizer(TEXT * 2, return_tensors="pt").input_ids
        tokens = ids.shape[1]
        res = generate_compressed(lm, input_ids=ids, policy="streaming", capacity=10, max_new_tokens=1,
                                  policy_options={"sink": 4, "window": 0})
        heads = mod.kept_masks(res.cache, tokens)
        compressed = [layer for layer in res.cache.stores if not layer.is_sliding]
        assert len(heads) == len(compressed) * lm.identity.num_kv_heads          # sliding layers left out
        expected = np.zeros(tokens, dtype=bool)
        expected[:4] = True
        expected[tokens - 6:] = True
        assert all(np.array_equal(k, expected) for k in heads)
