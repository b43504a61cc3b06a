"""SmolLM2 with layers offloaded to disk by accelerate: profiles and compressed generation identical to the
model in memory (the attention-row recorder and the compressed cache under accelerate's hooks)."""

from __future__ import annotations

import json

import pytest
import torch

import headprobe
from headprobe import ProfileRequest, run_profile

pytestmark = pytest.mark.slow

PROMPT = "The harbour office keeps its records. The secret code is blue tulip seven. " * 10 + "What is the secret code?"


def _disk_map(layers: int) -> dict[str, str]:
    """The embedding (tied to the head), the final norm and every odd layer on disk; the rest in memory."""
    placed = {"model.embed_tokens": "disk", "lm_head": "disk", "model.norm": "disk", "model.rotary_emb": "cpu"}
    placed.update({f"model.layers.{i}": "disk" if i % 2 else "cpu" for i in range(layers)})
    return placed


@pytest.fixture(scope="module")
def offloaded(smollm2, tmp_path_factory):
    lm = headprobe.load_model("smollm2-135m", device_map=_disk_map(smollm2.identity.num_layers),
                              offload_folder=tmp_path_factory.mktemp("offload"), dtype="float32")
    on_disk = [name for name, where in lm.model.hf_device_map.items() if where == "disk"]
    assert len(on_disk) == 3 + smollm2.identity.num_layers // 2
    assert lm.model.get_input_embeddings().weight.device.type == "meta"        # loaded by its hook per forward
    assert lm.model.model.layers[1].self_attn.q_proj.weight.device.type == "meta"
    return lm


def _profile(lm, out):
    request = ProfileRequest(probes=["retrieval", "enhanced_retrieval", "retrieval_reasoning", "layer_retention"],
                             lengths=[300], depths=[0.0, 1.0], out_dir=out, needle_ids=["r01", "r02", "q01", "q02"],
                             gate="likelihood", tasks=["single_doc_qa"], samples_per_task=1, batch_size=2)
    result = run_profile(lm, request)
    assert not result.failures
    return {p.name.split(".")[1]: json.loads(p.read_text()) for p in result.profiles}


def test_profile_scores_equal_the_model_in_memory(smollm2, offloaded, tmp_path, one_thread):
    ref = _profile(smollm2, tmp_path / "memory")
    out = _profile(offloaded, tmp_path / "offloaded")
    assert set(out) == set(ref) == {"retrieval", "enhanced_retrieval", "retrieval_reasoning", "layer_retention"}
    for kind in ref:
        assert out[kind]["fingerprint"] == ref[kind]["fingerprint"], kind        # scores, bit for bit
        assert out[kind]["scores"] == ref[kind]["scores"] and out[kind]["retention"] == ref[kind]["retention"]
        assert {k: v for k, v in out[kind]["trials"].items() if k != "mean_seconds"} == \
            {k: v for k, v in ref[kind]["trials"].items() if k != "mean_seconds"}
    assert ref["retrieval"]["trials"]["passed"] > 0 and ref["retrieval_reasoning"]["trials"]["passed"] > 0


def test_compressed_generation_equals_the_model_in_memory(smollm2, offloaded, one_thread):
    for policy in ("full", "snapkv", "dynamickv"):
        ref = headprobe.generate_compressed(smollm2, PROMPT, policy=policy, capacity=48, max_new_tokens=16, chat=True)
        out = headprobe.generate_compressed(offloaded, PROMPT, policy=policy, capacity=48, max_new_tokens=16,
                                            chat=True)
        assert torch.equal(out.sequences, ref.sequences), (policy, out.texts, ref.texts)
        assert torch.equal(out.cache.kept_tokens(), ref.cache.kept_tokens()), policy
        assert out.memory_bytes == ref.memory_bytes, policy
        if policy == "full":
            assert "blue tulip seven" in out.texts[0]
        else:
            assert out.memory_bytes < out.full_cache_bytes / 2, policy
    # one recorded prompt forward replayed into the cache (the eval's shared prefill)
    ref = headprobe.generate_from_prefill(smollm2, headprobe.record_prefill(smollm2, PROMPT, chat=True),
                                          policy="snapkv", capacity=48, max_new_tokens=16)
    out = headprobe.generate_from_prefill(offloaded, headprobe.record_prefill(offloaded, PROMPT, chat=True),
                                          policy="snapkv", capacity=48, max_new_tokens=16)
    assert torch.equal(out.sequences, ref.sequences)


def test_generate_command_with_max_memory_offloads_and_answers_the_same(tmp_path, capsys, one_thread):
    from headprobe_cli.main import main

    args = ["generate", "--policy", "snapkv", "--capacity", "48", "--max-new-tokens", "16", PROMPT]
    assert main([*args, "--device", "cpu"]) == 0
    in_memory = capsys.readouterr().out
    # 350 MB of the model's 540 (float32) in memory: the last layers stay on disk
    assert main([*args, "--device", "auto", "--max-memory", "cpu=350MB", "--offload-folder",
                 str(tmp_path / "offload")]) == 0
    assert capsys.readouterr().out == in_memory
