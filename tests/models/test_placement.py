"""Layers placed by accelerate (CPU and disk): the same answers as the model in memory, one-line errors."""

from __future__ import annotations

import pytest
import torch

import headprobe
from headprobe import HeadprobeError
from headprobe.frontend import parse_max_memory

torch.set_num_threads(1)


def test_max_memory_reads_devices_and_sizes():
    assert parse_max_memory(["0=20GiB", "cuda:1=1GB", "cpu=300MB", "disk=0"]) == {
        0: 20 * 2**30, 1: 10**9, "cpu": 300 * 10**6, "disk": 0}


@pytest.mark.parametrize("items, expected", [
    (["cpu"], "max_memory='cpu': expected DEVICE=SIZE, e.g. 0=20GiB or cpu=300MB"),
    (["gpu=1GB"], "'gpu' is not a device; expected cpu, disk, a GPU index or cuda:N"),
    (["cpu=lots"], "max_memory='cpu=lots': expected a size such as 20GiB or 300MB"),
])
def test_bad_max_memory_is_one_line(items, expected):
    with pytest.raises(HeadprobeError) as err:
        parse_max_memory(items)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_spreading_needs_device_auto(tiny_dir, tmp_path, capsys):
    with pytest.raises(HeadprobeError, match=r"^max_memory spreads the model over devices; it needs "
                                             r"device='auto', not device='cpu'$"):
        headprobe.load_model(str(tiny_dir), device="cpu", max_memory={"cpu": "1GB"})
    from headprobe_cli.main import main

    assert main(["generate", "--model", str(tiny_dir), "--device", "cpu", "--offload-folder", str(tmp_path),
                 "hello"]) == 2
    assert capsys.readouterr().err.strip() == ("headprobe: error: --offload-folder spreads the model over devices; "
                                               "it needs --device auto, not --device cpu")


#: The embedding (where inputs go), the head and every other layer on disk; the rest in memory.
DISK_MAP = {"model.embed_tokens": "disk", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "cpu",
            "model.layers.3": "disk", "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}


def test_layers_on_disk_give_the_answers_of_the_model_in_memory(tiny_dir, tmp_path):
    """The compressed cache with the embedding and half the layers offloaded to disk: the same tokens, the
    same kept tokens and bytes. Inputs go to the embedding's execution device (its weights are on meta)."""
    memory = headprobe.load_model(str(tiny_dir), device="cpu")
    offloaded = headprobe.load_model(str(tiny_dir), device_map=DISK_MAP, offload_folder=tmp_path / "offload")
    embedding = offloaded.model.get_input_embeddings().weight
    assert embedding.device.type == "meta" and offloaded.device == torch.device("cpu")
    assert set(offloaded.model.hf_device_map.values()) == {"cpu", "disk"}
    prompts = ["The river ran past the old mill. " * 6 + "What ran past the mill?",
               "Numbers like 42 appear in reports. " * 9 + "Which number?"]
    for policy in ("snapkv", "dynamickv", "keepkv"):
        ref = headprobe.generate_compressed(memory, prompts, policy=policy, capacity=12, max_new_tokens=8)
        out = headprobe.generate_compressed(offloaded, prompts, policy=policy, capacity=12, max_new_tokens=8)
        assert torch.equal(out.sequences, ref.sequences), policy
        assert torch.equal(out.cache.kept_tokens(), ref.cache.kept_tokens()), policy
        assert out.memory_bytes == ref.memory_bytes < ref.full_cache_bytes, policy


def test_max_memory_sends_what_does_not_fit_to_disk(tiny_dir, tmp_path):
    offloaded = headprobe.load_model(str(tiny_dir), device="auto", max_memory={"cpu": "400KB"},
                                     offload_folder=tmp_path / "offload")
    placed = offloaded.model.hf_device_map
    assert "disk" in placed.values() and "cpu" in placed.values(), placed
    assert offloaded.model.dtype == torch.float32            # dtype auto on a machine without GPU
    memory = headprobe.load_model(str(tiny_dir), device="cpu")
    ids = torch.randint(3, 300, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(offloaded.model(ids).logits, memory.model(ids).logits, rtol=0, atol=0)
