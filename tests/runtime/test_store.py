"""The layer store's verbs: what each one keeps, moves and counts, and that policies use nothing else."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import torch

import headprobe.runtime.policies as policies_package
from headprobe.runtime.store import LayerStore, Selection

HEAD_DIM = 4


def _store(counts=(3, 2, 4), capacity=6, votes=False) -> LayerStore:
    """One batch row, ``len(counts)`` KV heads; segment ``s`` holds prompt tokens ``0..counts[s]-1`` whose
    keys are ``10 * s + token`` in every coordinate (values are the negated keys)."""
    heads, n = len(counts), max(counts)
    keys = (10 * torch.arange(heads)[:, None] + torch.arange(n)[None, :]).float()[None, :, :, None]
    keys = keys.expand(1, heads, n, HEAD_DIM).contiguous()
    store = LayerStore().allocate(1, heads, HEAD_DIM, torch.full((heads,), capacity), torch.float32,
                                  torch.device("cpu"), votes=votes)
    selection = Selection(torch.arange(n)[None].repeat(heads, 1), torch.tensor(counts))
    store.write_selection(keys, -keys, torch.arange(n)[None], selection)
    return store


def _held(store: LayerStore) -> list[list[float]]:
    """Each segment's keys (first coordinate), in slot order."""
    view = store.padded()
    return [view["keys"][s, :int(view["valid"][s].sum()), 0].tolist() for s in range(store.segments)]


def test_a_store_is_empty_until_allocated_and_after_release():
    store = LayerStore()
    assert not store.allocated
    store.allocate(1, 2, HEAD_DIM, torch.tensor([3, 3]), torch.float32, torch.device("cpu"))
    assert store.allocated and store.lengths.tolist() == [0, 0] and store.memory_bytes() > 0
    store.release()
    assert not store.allocated


def test_replace_pairs_overwrites_only_the_masked_segments():
    store = _store(votes=True)
    store.add_pair_state("score", torch.ones(3, 4))
    before = _held(store)
    new_keys = torch.full((3, HEAD_DIM), 99.0)
    store.replace_pairs(torch.tensor([1, 0, 3]), torch.tensor([True, False, True]), new_keys, -new_keys,
                        log_votes=torch.tensor([0.5, 0.6, 0.7]), state={"score": torch.tensor([7.0, 8.0, 9.0])})
    after = _held(store)
    assert after[0] == [before[0][0], 99.0, before[0][2]]
    assert after[1] == before[1]                                   # not masked: untouched
    assert after[2] == before[2][:3] + [99.0]
    view = store.padded()
    assert view["log_votes"][0, 1] == 0.5 and view["log_votes"][2, 3] == 0.7 and view["log_votes"][1][view["valid"][1]].eq(0).all()
    scores = store.pair_state("score", view["index"])
    assert scores[0].tolist()[:3] == [1.0, 7.0, 1.0] and scores[1].tolist()[:2] == [1.0, 1.0]
    assert scores[2].tolist()[:4] == [1.0, 1.0, 1.0, 9.0]


def test_pair_state_starts_with_the_first_pairs_moves_with_its_pair_and_is_counted():
    store = _store()
    plain = store.memory_bytes()
    first = torch.arange(12, dtype=torch.float64).reshape(3, 4)            # values of slots 0..3
    store.add_pair_state("score", first)
    assert store.memory_bytes() == plain + (6 * 3 + 1) * 4                # one float32 per row, spare included
    view = store.padded()
    got = store.pair_state("score", view["index"])
    assert got[0, :3].tolist() == [0.0, 1.0, 2.0] and got[1, :2].tolist() == [4.0, 5.0]
    assert got[2, :4].tolist() == [8.0, 9.0, 10.0, 11.0]
    # Removing slot 0 of segment 0 moves its last pair (slot 2, score 2) into the slot, score with it.
    full = torch.tensor([True, False, False])
    store.remove(torch.tensor([0, 0, 0]), full, full.numpy())
    assert _held(store)[0] == [2.0, 1.0]
    assert store.pair_state("score", store.padded()["index"])[0, :2].tolist() == [2.0, 1.0]
    # Keeping slots [1, 0] of segment 2 and re-laying out keep the pairs' scores; appended pairs start at 0.
    store.keep_in_place(torch.tensor([[0, 1], [0, 1], [3, 1]]), torch.tensor([2, 2, 2]), np.array([2, 2, 2]))
    store.relayout(3)
    store.append(torch.zeros(1, 3, 1, HEAD_DIM), torch.zeros(1, 3, 1, HEAD_DIM), torch.tensor([[50]]))
    got = store.pair_state("score", store.padded()["index"])
    assert got[:, :3].tolist() == [[2.0, 1.0, 0.0], [4.0, 5.0, 0.0], [11.0, 9.0, 0.0]]


def test_set_pair_state_writes_through_the_view_index():
    store = _store()
    store.add_pair_state("score", torch.zeros(3, 4))
    index = store.padded()["index"][:, :4]              # the view is wider than the longest segment (4)
    store.set_pair_state("score", index, torch.arange(12.0).reshape(3, 4))
    got = store.pair_state("score", index)
    assert got[0, :3].tolist() == [0.0, 1.0, 2.0] and got[2].tolist() == [8.0, 9.0, 10.0, 11.0]


def test_keep_first_cuts_segments_and_the_peak_remembers():
    store = _store()
    store.keep_first(torch.tensor([1, 2, 0]))
    assert store.lengths.tolist() == store.host_lengths.tolist() == [1, 2, 0]
    assert _held(store) == [[0.0], [10.0, 11.0], []]
    assert store.peak().tolist() == [[3, 2, 4]] and store.kept().tolist() == [[1, 2, 0]]


def test_state_bytes_are_counted_and_survive_a_relayout():
    store = _store()
    plain = store.memory_bytes()
    store.set_state_bytes(1000)
    assert store.memory_bytes() == plain + 1000
    store.relayout(0)
    # The pairs held, the spare row (keys, values, position) and three int64 per segment (offset, length, capacity).
    assert store.memory_bytes() == store.used_bytes() + (2 * 4 * HEAD_DIM + 4) + 3 * 3 * 8 + 1000


def _store_uses(tree: ast.AST) -> list[tuple[str, int, str]]:
    """``(attribute, line, how)`` for every attribute of a store the code reads or writes: ``store.x``,
    ``ctx.store.x`` and ``held.store.x``; ``how`` is ``"write"`` for an assignment to it or into it."""
    def is_store(node: ast.AST) -> bool:
        return (isinstance(node, ast.Name) and node.id == "store") or \
            (isinstance(node, ast.Attribute) and node.attr == "store")

    written: set[int] = set()
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        for target in targets:
            while isinstance(target, ast.Subscript):
                target = target.value
            if isinstance(target, ast.Attribute) and is_store(target.value):
                written.add(id(target))
    return [(node.attr, node.lineno, "write" if id(node) in written else "read") for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and is_store(node.value)]


def test_policies_change_their_store_only_through_its_verbs():
    """No policy module writes a store attribute (``store.keys[rows] = ...``) or touches a private one; every
    attribute they use is a public method or read-only property of ``LayerStore``."""
    public = {name for name in dir(_store()) if not name.startswith("_")}
    found = []
    for path in sorted(Path(policies_package.__file__).parent.glob("*.py")):
        for attr, line, how in _store_uses(ast.parse(path.read_text())):
            if how == "write" or attr not in public:
                found.append(f"{path.name}:{line} {how} store.{attr}")
    assert found == []
    # The check sees what it is looking for.
    planted = ast.parse("store.keys[rows] = x\nctx.store.lengths = y\nstore._keys.add_(1)\n")
    assert sorted((a, h) for a, _, h in _store_uses(planted)) == [("_keys", "read"), ("keys", "write"),
                                                                   ("lengths", "write")]


def test_view_width_rounds_up_with_at_most_a_quarter_of_padding():
    from headprobe.runtime.store import view_width

    assert [view_width(n) for n in (0, 1, 32, 33, 256, 257, 1000, 2000)] == [32, 32, 32, 64, 256, 320, 1024, 2048]
    for n in range(1, 5000):
        w = view_width(n)
        assert n <= w and (w - n < 32 or (w - n) / n <= 0.25) and w % 32 == 0
