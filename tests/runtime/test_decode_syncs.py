"""Decoding never reads a device value on the host.

On a GPU each such read (``.item()``, ``bool(tensor)``, ``int(tensor)``, ``nonzero``, boolean-mask
indexing) waits until the device has finished everything queued before it; one per layer per token costs
more than the decode kernel itself. On the CPU a ``TorchDispatchMode`` sees the operators that do it, so
these tests count them inside every policy's decode call (``Policy.decode``: eviction, append, attention,
score updates) while ``generate_compressed`` runs a batch with left padding and a capacity small enough
that the constant-size policies evict at every step.
"""

from __future__ import annotations

from collections import Counter

import conftest
import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import headprobe
from headprobe.models.cache_argument import with_cache
from headprobe.runtime.generate import make_policy
from headprobe.runtime.store import LayerStore, Selection

#: Operators that read device data on the host.
_READS = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default, torch.ops.aten.nonzero.default,
          torch.ops.aten.nonzero_static.default, torch.ops.aten.is_nonzero.default,
          torch.ops.aten.masked_select.default, torch.ops.aten.unique_consecutive.default,
          torch.ops.aten._unique2.default, torch.ops.aten.repeat_interleave.Tensor}
#: Operators that do so when indexed with a boolean mask.
_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put_.default, torch.ops.aten.index_put.default,
             torch.ops.aten._index_put_impl_.default}


class HostReads(TorchDispatchMode):
    """Counts operators that make the host wait for the device, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in _READS:
            self.counts[str(func)] += 1
        elif func in _INDEXING and any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
                                       for i in args[1] if i is not None):
            self.counts[f"{func} (boolean mask)"] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def test_the_counter_sees_each_kind_of_host_read():
    x = torch.arange(6.0)
    with HostReads() as reads:
        bool((x > 2).any())
        int(x.max())
        x[x > 2]
        x[x > 4] = 0.0
        torch.nonzero(x)
        x.sum().item()
    assert reads.total == 6, reads.counts


CAPACITY, PROMPT, NEW = 24, 60, 10
#: Host reads allowed per layer per decoded token. The eviction policies (KeepKV merges, MorphKV
#: re-scores) decide on the host mirror too, so their bound is the same zero.
BOUNDS = {"full": 0, "snapkv": 0, "streaming": 0, "dynamickv": 0, "keydiff": 0, "keepkv": 0, "morphkv": 0}
OPTIONS = {"morphkv": {"window": 8}}


def _counted(policy) -> tuple[list[HostReads], callable]:
    calls: list[HostReads] = []
    decode = policy.decode

    def counted(ctx):
        with HostReads() as reads:
            out = decode(ctx)
        calls.append(reads)
        return out

    return calls, counted


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 300, (2, PROMPT), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :7] = 0                                 # left padding in the second row
    return ids, mask


@pytest.mark.parametrize("name", list(BOUNDS))
def test_decode_reads_nothing_from_the_device(tiny_llama, one_thread, name):
    policy = make_policy(name, **OPTIONS.get(name, {}))
    calls, policy.decode = _counted(policy)
    ids, mask = _batch()
    res = headprobe.generate_compressed(tiny_llama, input_ids=ids, attention_mask=mask, policy=policy,
                                        capacity=CAPACITY, max_new_tokens=NEW, min_new_tokens=NEW)
    layers = tiny_llama.identity.num_layers
    assert len(calls) == layers * (NEW - 1)         # every decoding step of every layer was counted
    worst = max(calls, key=lambda r: r.total)
    assert worst.total <= BOUNDS[name], f"{name}: {worst.total} host reads in one decode call: {dict(worst.counts)}"
    kept = res.cache.kept_tokens()
    if name in ("streaming", "keepkv", "morphkv", "keydiff"):
        assert int(kept.max()) <= CAPACITY           # they really evicted at every step
    for store in res.cache.stores:                  # the host mirror equals the device metadata
        assert store.host_lengths.tolist() == store.lengths.tolist()
        assert store.host_capacity.tolist() == store.capacity.tolist()


def test_sliding_window_layers_decode_without_host_reads(tiny_gemma3, one_thread):
    policy = make_policy("snapkv")
    calls, policy.decode = _counted(policy)
    sliding = headprobe.runtime.policies.SlidingWindow()
    sliding_calls, sliding.decode = _counted(sliding)
    ids, mask = _batch()
    cache = headprobe.runtime.generate.new_cache(tiny_gemma3, policy, CAPACITY, None, None, None, NEW, mask)
    cache.sliding_policy = sliding
    with headprobe.runtime.cache.headprobe_attention(tiny_gemma3.model):
        tiny_gemma3.model.generate(input_ids=ids, attention_mask=mask, **with_cache(tiny_gemma3.model, cache), max_new_tokens=NEW,
                                   min_new_tokens=NEW, do_sample=False)
    assert len(sliding_calls) == 3 * (NEW - 1) and len(calls) == NEW - 1
    assert max(r.total for r in sliding_calls + calls) == 0
    for store, kind in zip(cache.stores, cache.layer_types):
        if kind == "sliding_attention":
            assert int(store.lengths.max()) <= 16     # the window, evicting the oldest at every step


def _reads_per_token(run) -> float:
    """Host reads per decoded token of ``run(new_tokens)``: the difference between 8 and 2 new tokens."""
    totals = []
    for new in (2, 8):
        with HostReads() as reads:
            run(new)
        totals.append(reads.total)
    return (totals[1] - totals[0]) / 6


def test_a_whole_decoding_step_reads_no_more_than_stock_generate_whatever_the_layers(one_thread):
    """What remains per token is transformers' own loop (its stopping check: one read per token in recent
    releases, more in early 5.x), no more than ``model.generate`` with its own cache; not one per layer."""
    per_token, stock = [], []
    for layers in (2, 6):
        lm = conftest.make_tiny_llama(layers=layers)
        ids, mask = _batch()
        per_token.append(_reads_per_token(lambda new, lm=lm, ids=ids, mask=mask: headprobe.generate_compressed(
            lm, input_ids=ids, attention_mask=mask, policy="keepkv", capacity=CAPACITY, max_new_tokens=new,
            min_new_tokens=new)))
        stock.append(_reads_per_token(lambda new, lm=lm, ids=ids, mask=mask: lm.model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False,
            pad_token_id=lm.tokenizer.pad_token_id)))
    assert per_token[0] == per_token[1] <= stock[0] == stock[1], (per_token, stock)


def test_ragged_attention_hands_the_host_maximum_to_the_decode_kernel(monkeypatch):
    """On CUDA the decode kernel sizes its launch from the longest segment: dispatch passes the store's host
    maximum, so the kernel does not read ``lengths`` (``int(lengths.max())``) itself."""
    from headprobe.runtime.kernels import dispatch, ragged_decode
    from headprobe.runtime.kernels.torch_ref import ragged_attention_torch

    g = torch.Generator().manual_seed(1)
    keys, values = torch.randn(1, 2, 30, 16, generator=g), torch.randn(1, 2, 30, 16, generator=g)
    count = torch.tensor([30, 11])
    index = torch.arange(30)[None].repeat(2, 1)
    store = LayerStore().allocate(1, 2, 16, count + 4, keys.dtype, keys.device)
    store.write_selection(keys, values, torch.arange(30)[None], Selection(index=index, count=count))
    seen = {}

    def kernel(query, k, v, positions, offsets, lengths, kv_heads, qpos, scaling, window=None, votes=None,
               split=None, max_len=None):
        seen["max_len"] = max_len
        view = store.padded()
        return ragged_attention_torch(query, view["keys"], view["values"], view["positions"], view["valid"], qpos,
                                      scaling)

    monkeypatch.setattr(ragged_decode, "ragged_decode_triton", kernel)
    monkeypatch.setattr(dispatch, "_use_triton", lambda device: True)
    query = torch.randn(1, 4, 1, 16, generator=g)
    with HostReads() as reads:
        dispatch.ragged_attention(query, store, torch.tensor([[30]]), 0.25, max_len=store.max_length())
    assert seen["max_len"] == 30 and reads.total == 0


def test_store_writes_of_empty_segments_go_to_the_spare_row():
    """Dense writes: a segment with nothing to move writes the spare row, never another segment's pairs."""
    keys = torch.arange(2 * 2 * 6 * 4, dtype=torch.float32).reshape(2 * 2, 6, 4)[None].reshape(1, 4, 6, 4)
    store = LayerStore().allocate(1, 4, 4, torch.tensor([6, 6, 6, 6]), torch.float32, torch.device("cpu"))
    count = torch.tensor([6, 3, 6, 1])
    store.write_selection(keys, -keys, torch.arange(6)[None], Selection(torch.arange(6)[None].repeat(4, 1), count))
    before = {k: v.clone() for k, v in store.padded().items()}      # (views of the buffer otherwise)
    full, host_full = store.at_limit()
    assert host_full.tolist() == [True, False, True, False]
    store.remove(torch.tensor([1, 0, 4, 0]), full, host_full)
    after = {k: v.clone() for k, v in store.padded().items()}
    assert store.host_lengths.tolist() == store.lengths.tolist() == [5, 3, 5, 1]
    for s in (1, 3):                                   # untouched
        assert torch.equal(after["keys"][s, :int(count[s])], before["keys"][s, :int(count[s])])
    assert torch.equal(after["keys"][0, 1], before["keys"][0, 5])       # the last pair moved into slot 1
    assert torch.equal(after["keys"][2, 4], before["keys"][2, 5])
    keep = torch.tensor([[4, 0, 0], [2, 1, 0], [3, 2, 1], [0, 0, 0]])
    store.keep_in_place(keep, torch.tensor([2, 3, 1, 0]), np.array([2, 3, 1, 0]))
    kept = store.padded()
    assert store.lengths.tolist() == [2, 3, 1, 0]
    assert torch.equal(kept["keys"][1, :3], after["keys"][1, [2, 1, 0]])
    assert torch.equal(kept["keys"][0, :2], after["keys"][0, [4, 0]])
    assert torch.equal(kept["keys"][2, 0], after["keys"][2, 3])
