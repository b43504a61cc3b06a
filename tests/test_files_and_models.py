"""File validation, model resolution, the row recorder on tiny models (including sliding windows)."""

from __future__ import annotations

import json

import pytest
import torch

import headprobe
from headprobe import HeadprobeError, Profile
from headprobe.attention import RowRecorder, RowRequest
from headprobe.errors import FileFormatError
from headprobe.files.trial_log import TrialLog, read_log
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


def test_unknown_alias_suggests_close_matches():
    with pytest.raises(HeadprobeError, match="did you mean smollm2-135m"):
        headprobe.resolve_model("smolm2-135m")


def test_remote_code_refused_without_flag(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": {"AutoModel": "x.Y"}}))
    with pytest.raises(HeadprobeError, match="pass trust_remote_code=True if you trust it"):
        headprobe.load_model(str(tmp_path), device="cpu")
    with headprobe.flag_spelling({}), pytest.raises(HeadprobeError, match=r"^--model \S+: .* pass --trust-remote-code"):
        headprobe.load_model(str(tmp_path), device="cpu")


def test_loading_onto_the_device_keeps_the_weights(tiny_dir):
    from transformers import AutoModelForCausalLM

    lm = headprobe.load_model(str(tiny_dir), device="cpu")
    plain = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    assert lm.device.type == "cpu" and lm.model.dtype == torch.float32
    ids = torch.randint(3, 300, (1, 20))
    assert torch.equal(lm.model(ids).logits, plain(ids).logits)


def test_a_large_model_landing_on_the_cpu_warns_why(tiny_dir, monkeypatch):
    import warnings

    from headprobe.models import loading

    monkeypatch.setattr(loading, "LARGE_ON_CPU", 1)   # the tiny model counts as large
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        headprobe.load_model(str(tiny_dir), device="cpu")        # asked for: no warning
    if torch.cuda.is_available():
        pytest.skip("a GPU is available: the default device is not the CPU")
    with pytest.warns(RuntimeWarning, match=r"is on the CPU: .*CUDA.*pass device='cpu' to use the CPU on purpose"):
        headprobe.load_model(str(tiny_dir))
    monkeypatch.setattr(loading, "LARGE_ON_CPU", 10**12)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        headprobe.load_model(str(tiny_dir))                        # small models load quietly


def test_model_errors_name_parameters_in_the_callers_spelling(tmp_path):
    with pytest.raises(HeadprobeError, match=r"^dtype='float64': expected one of auto, float32"):
        headprobe.load_model("smollm2-135m", dtype="float64")
    with pytest.raises(HeadprobeError, match=r"^model='\./nosuch': no such directory"):
        headprobe.resolve_model("./nosuch")
    with headprobe.flag_spelling({}), pytest.raises(HeadprobeError, match=r"^--dtype float64: expected"):
        headprobe.load_model("smollm2-135m", dtype="float64")


def test_unwritable_output_dir(tmp_path):
    from headprobe.files.jsonio import check_writable_dir

    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(HeadprobeError, match="not writable"):
        check_writable_dir(blocker / "sub")


def test_trial_log_resume_rules(tmp_path):
    path = tmp_path / "t.jsonl"
    log = TrialLog(path, {"a": 1})
    log.append({"trial": "t1", "x": 1})
    with pytest.raises(HeadprobeError, match="pass resume=True to continue it or force=True to start over"):
        TrialLog(path, {"a": 1})
    with pytest.raises(HeadprobeError, match=r"other settings \(a\)"):
        TrialLog(path, {"a": 2}, resume=True)
    log.close()                               # an open log is locked against every other writer
    with open(path, "a") as handle:
        handle.write('{"trial": "t2", "x"')  # torn write
    again = TrialLog(path, {"a": 1, "batch_size": 8}, resume=True)
    assert "t1" in again and "t2" not in again
    again.append({"trial": "t2", "x": 2})
    _, trials = read_log(path)
    assert [t["trial"] for t in trials] == ["t1", "t2"]


@pytest.mark.parametrize("maker", ["make_tiny_llama", "make_tiny_gemma3"])
def test_recorder_rows_equal_eager_attention(maker):
    import conftest
    from transformers import DynamicCache

    lm = getattr(conftest, maker)()
    model = lm.model
    ids = torch.randint(3, 300, (1, 40))
    reference = model(ids).logits
    model.set_attn_implementation("eager")
    eager = model(ids, output_attentions=True).attentions
    model.set_attn_implementation("sdpa")
    got = {}
    with RowRecorder(model) as rec:
        rec.request = RowRequest(torch.tensor([[35, 39]]), 0, lambda l, r, kp: got.__setitem__(l, r))
        out = model(ids).logits
    assert model.config._attn_implementation == "sdpa"
    assert torch.equal(out, reference)          # recording does not change the forward
    for layer, rows in got.items():
        torch.testing.assert_close(rows, eager[layer][:, :, [35, 39]], atol=1e-6, rtol=1e-5)
    # the second block of a cached forward: rows over all 40 keys
    cache = DynamicCache()
    model(ids[:, :30], past_key_values=cache)
    got.clear()
    with RowRecorder(model) as rec:
        rec.request = RowRequest(torch.tensor([[35, 39]]), 30, lambda l, r, kp: got.__setitem__(l, r))
        model(ids[:, 30:], past_key_values=cache)
    for layer, rows in got.items():
        torch.testing.assert_close(rows, eager[layer][:, :, [35, 39]], atol=1e-6, rtol=1e-5)


def test_retention_on_tiny_gemma_sums_to_one():
    import conftest

    from headprobe.haystack.tasks import TaskSample
    from headprobe.probes.retention import RetentionConfig, run_retention_sample

    lm = conftest.make_tiny_gemma3()
    sample = TaskSample("s1", "single_doc_qa", "The river ran past the old mill. " * 20, "Where did it run?")
    record = run_retention_sample(lm, sample, RetentionConfig(capacity=4, max_tokens=120, chat_template=False))
    assert len(record["retention"]) == 4 and abs(sum(record["retention"]) - 1) < 1e-5
