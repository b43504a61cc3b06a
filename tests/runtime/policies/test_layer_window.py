"""``layer_window``: a layer split runs as the engines run it. Each local layer keeps exactly its sink and its last
``W - sink`` tokens (prompt and decode), global layers everything, and the answer equals transformers' own
sliding-window attention on the same weights."""

from __future__ import annotations

import pytest
import torch

from headprobe.allocation.layer_split_choice import split_budget_map
from headprobe.allocation.registry import ALLOCATORS
from headprobe.errors import HeadprobeError
from headprobe.eval.settings import expand_settings
from headprobe.layer_split import GLOBAL, LayerSplit
from headprobe.runtime.generate import generate_compressed
from tests.conftest import _TINY_TEXT, _tiny_tokenizer, make_tiny_gemma3

pytestmark = pytest.mark.usefixtures("one_thread")

TEXT = _TINY_TEXT[:600]


def held_positions(cache, layer: int) -> list[list[int]]:
    """Per KV head of batch row 0, the sorted positions the layer holds."""
    view = cache.stores[layer].padded()
    out = []
    for h in range(view["positions"].shape[0]):
        ok = view["valid"][h]
        out.append(sorted(view["positions"][h][ok].tolist()))
    return out


def expected(seen: int, window: int | str, sink: int) -> list[int]:
    if window == GLOBAL:
        return list(range(seen))
    recent = list(range(max(0, seen - (window - sink)), seen))
    return sorted(set(range(min(sink, seen))) | set(recent))


@pytest.mark.parametrize("new_tokens", [1, 7])
def test_each_local_layer_keeps_its_sink_and_last_tokens_and_global_layers_everything(tiny_llama, new_tokens):
    layers = (12, GLOBAL, 9, 20)
    split = LayerSplit(model=tiny_llama.identity, engine="tensorrt-llm", layers=layers, sink=3, context=64)
    res = generate_compressed(tiny_llama, TEXT, policy="layer_window", budget=split, policy_options={"sink": 3},
                              max_new_tokens=new_tokens)
    seen = int(res.cache.prompt_lengths[0]) + new_tokens - 1          # the last new token is never fed back
    assert seen > 40
    for layer, window in enumerate(layers):
        for head in held_positions(res.cache, layer):
            assert head == expected(seen, window, 3), (layer, window)


def test_split_equals_transformers_sliding_window_on_the_same_weights():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from headprobe.models.identity import identity_from_config
    from headprobe.models.loading import LoadedModel

    tok = _tiny_tokenizer()
    shape = {"vocab_size": len(tok), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 4096,
                 "bos_token_id": tok.bos_token_id, "eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    torch.manual_seed(0)
    plain = Qwen2ForCausalLM(Qwen2Config(**shape)).eval()
    types = ["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"]
    engine = Qwen2ForCausalLM(Qwen2Config(**shape, layer_types=types, use_sliding_window=True, sliding_window=10,
                                          max_window_layers=0)).eval()
    engine.load_state_dict(plain.state_dict())
    for m in (plain, engine):
        m.config._attn_implementation = "sdpa"
    assert [layer.self_attn.sliding_window for layer in engine.model.layers] == [10, None, 10, 10]
    lm = LoadedModel(model=plain, tokenizer=tok, identity=identity_from_config(plain.config, "tiny-qwen2", "test"))
    split = LayerSplit(model=lm.identity, engine="vllm", layers=(10, GLOBAL, 10, 10), context=64)
    ids = tok(TEXT[:300], return_tensors="pt")["input_ids"]
    kwargs = {"max_new_tokens": 8, "do_sample": False, "pad_token_id": tok.pad_token_id}
    reference = engine.generate(input_ids=ids, **kwargs)[0, ids.shape[1]:]
    full = plain.generate(input_ids=ids, **kwargs)[0, ids.shape[1]:]
    ours = generate_compressed(lm, input_ids=ids, policy="layer_window", budget=split_budget_map(split),
                               max_new_tokens=8).new_tokens[0]
    assert ours.tolist() == reference.tolist()
    assert full.tolist() != reference.tolist()             # the windows changed the answer: the check has teeth


def test_a_capacity_makes_every_layer_local(tiny_llama):
    res = generate_compressed(tiny_llama, TEXT, policy="layer_window", capacity=16, max_new_tokens=3)
    seen = int(res.cache.prompt_lengths[0]) + 2
    for layer in range(4):
        assert held_positions(res.cache, layer) == [expected(seen, 16, 0)] * 2


def test_gemma3_own_sliding_layers_take_the_split_window():
    lm = make_tiny_gemma3()
    split = LayerSplit(model=lm.identity, engine="vllm", layers=(8, 8, 8, GLOBAL), context=64)
    res = generate_compressed(lm, TEXT, policy="layer_window", budget=split, max_new_tokens=4)
    seen = int(res.cache.prompt_lengths[0]) + 3
    assert [held_positions(res.cache, i)[0] for i in range(4)] == [expected(seen, w, 0) for w in split.layers]


def test_refusals(tiny_llama, tmp_path):
    split = LayerSplit(model=tiny_llama.identity, engine="tensorrt-llm", layers=(12, GLOBAL, 9, 20), sink=3,
                       context=64)
    with pytest.raises(HeadprobeError, match="a layer split runs under the layer_window policy"):
        generate_compressed(tiny_llama, TEXT, policy="snapkv", budget=split, max_new_tokens=1)
    with pytest.raises(HeadprobeError, match="sink 0, but the split keeps a sink of 3"):
        generate_compressed(tiny_llama, TEXT, policy="layer_window", budget=split, max_new_tokens=1)
    with pytest.raises(HeadprobeError, match="a layer split keeps its own windows; give no capacity"):
        generate_compressed(tiny_llama, TEXT, policy="layer_window", budget=split, capacity=8, max_new_tokens=1)


def test_split_file_is_an_eval_setting(tiny_llama, tmp_path):
    split = LayerSplit(model=tiny_llama.identity, engine="vllm", layers=(16, GLOBAL, 16, 16), context=64)
    path = split.save(tmp_path / "split.json")
    (setting,) = expand_settings([f"layer_window:{path}"], [32])
    assert setting.allocation == "map" and setting.capacity == round((3 * 16 + 64) / 4)
    assert setting.options == {"sink": 0}
    assert setting.label == f"layer_window:{path}@28"
    with pytest.raises(HeadprobeError, match="is a layer split; it runs under the layer_window policy only"):
        expand_settings([f"snapkv:{path}"], [32])
    with pytest.raises(HeadprobeError, match="allocation layer_split runs under the layer_window policy only"):
        expand_settings(["snapkv:layer_split"], [32])


@pytest.mark.parametrize("allocation", [name for name, a in ALLOCATORS.items() if a.policy == "layer_window"])
def test_a_split_allocated_at_a_capacity_is_refused_with_the_way_to_run_it(allocation):
    """A split is sized at one context and window, so ``layer_window:ALLOCATION@C`` cannot make one; the refusal
    (before any model loads) names allocate and the file setting, instead of failing later on the window."""
    with pytest.raises(HeadprobeError) as err:
        expand_settings([f"layer_window:{allocation}"], [200])
    message = str(err.value)
    assert f"allocation {allocation} makes a layer split for one context and window" in message
    assert f"allocate --method {allocation} --window W --prompt-len N" in message
    assert "run layer_window:split.json" in message and "\n" not in message


@pytest.mark.slow
def test_smollm2_split_keeps_exact_windows(smollm2):
    layers = tuple(GLOBAL if i in (0, 1, 2, 11) else 64 for i in range(30))
    split = LayerSplit(model=smollm2.identity, engine="vllm", layers=layers, context=1024)
    prompt = ("The harbour vault code is 4817. " + "The tide came in over the grey stones of the pier. " * 30
              + "\nWhat is the harbour vault code?")
    res = generate_compressed(smollm2, prompt, policy="layer_window", budget=split, chat=True, max_new_tokens=5)
    seen = int(res.cache.prompt_lengths[0]) + 4
    assert seen > 300
    for layer in (0, 3, 11, 29):
        assert held_positions(res.cache, layer) == [expected(seen, layers[layer], 0)] * 3
    kept = res.cache.kept_tokens()[0]
    assert kept[3].tolist() == [64] * 3 and kept[0].tolist() == [seen] * 3


def test_split_setting_runs_through_the_eval_grid(tiny_llama, tmp_path):
    import headprobe
    from headprobe.eval.items import items_from_needles
    from headprobe.eval.runner import EvalRequest, run_eval

    split = LayerSplit(model=tiny_llama.identity, engine="vllm", layers=(16, GLOBAL, 16, 16), context=300)
    path = split.save(tmp_path / "split.json")
    items = items_from_needles(headprobe.load_needles(headprobe.shipped_needle_file("retrieval"))[:1])
    settings = expand_settings(["full", f"layer_window:{path}", "layer_window"], [16])
    request = EvalRequest(settings, items, [300], [0.5], headprobe.load_haystack(), {"kind": "needle"},
                          max_new_tokens=3, chat_template=False)
    result = run_eval(tiny_llama, request, tmp_path / "eval.json")
    used = {s["setting"]: s["used_bytes"] for s in result.summary()}
    label = f"layer_window:{path}@{round((3 * 16 + 300) / 4)}"
    assert result.complete and set(used) == {"full", label, "layer_window@16"}
    # three local layers of 16 tokens and one whole layer, against four local layers of 16
    assert used["layer_window@16"] < used[label] < used["full"]
