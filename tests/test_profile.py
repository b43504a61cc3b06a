"""Profiles: round trip, validation errors, and identity mismatches."""

from __future__ import annotations

import json

import pytest

import headprobe
from headprobe import Profile
from headprobe.errors import FileFormatError
from headprobe.models.identity import ModelIdentity


def _identity() -> ModelIdentity:
    return ModelIdentity("m", "test", "llama", 2, 4, 2, 8, ("full_attention", "full_attention"))


def _profile() -> Profile:
    return Profile(kind="retrieval", model=_identity(), probe={"mode": "fast"}, trials={"total": 2, "passed": 1},
                   query_heads=[[0.1, 0.0, 0.5, 0.2], [0.0, 0.3, 0.0, 0.0]], kv_heads=[[0.05, 0.35], [0.15, 0.0]])


def test_profile_round_trip_and_errors(tmp_path):
    path = _profile().save(tmp_path / "p.json")
    loaded = Profile.load(path)
    assert loaded.query_heads == _profile().query_heads and loaded.top_heads(2) == [(0, 2, 0.5), (1, 1, 0.3)]
    obj = json.loads(path.read_text())
    obj["version"] = 99
    (tmp_path / "new.json").write_text(json.dumps(obj))
    with pytest.raises(FileFormatError, match="version 99 is newer"):
        Profile.load(tmp_path / "new.json")
    obj["version"] = 1
    obj["scores"]["query_heads"][1] = [0.0, 0.1]
    (tmp_path / "ragged.json").write_text(json.dumps(obj))
    with pytest.raises(FileFormatError, match=r"ragged.json: field 'scores.query_heads\[1\]': expected 4 values"):
        Profile.load(tmp_path / "ragged.json")


def test_identity_mismatch_says_what_differs():
    a = _identity()
    b = ModelIdentity("m", "test", "llama", 2, 4, 1, 8, ("full_attention", "full_attention"))
    with pytest.raises(headprobe.ModelMismatchError, match="num_kv_heads 2 vs 1"):
        a.check_fits(b)
