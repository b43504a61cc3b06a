"""No profiling trial materialises anything that grows with the square of the prompt.

Every tensor an operator allocates during a fast-mode and a reference-mode trial of a tiny model is
watched (a ``TorchDispatchMode`` sees each operator's outputs); the largest one must grow linearly with
the prompt: doubling the length at most doubles it (plus slack), and it stays below one byte per
(query, key) pair. Attention rows are kept only at the scored positions, so they are
``[batch, heads, steps, keys]``. The masked prompt forward (``split_attention=False``), which needs a
``[batch, 1, block, keys]`` mask, is the control: there the largest tensor grows quadratically.
"""

from __future__ import annotations

import conftest
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import headprobe


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor (in bytes) any operator allocates while active (views of an input skipped)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.where = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if (isinstance(t, torch.Tensor) and t.numel() * t.element_size() > self.bytes
                    and t.untyped_storage().data_ptr() not in inputs):      # views allocate nothing
                self.bytes = t.numel() * t.element_size()
                self.where = f"{func} -> {tuple(t.shape)} {t.dtype}"
        return out


LENGTHS = (600, 1200)


@pytest.fixture(scope="module")
def tiny():
    return conftest.make_tiny_llama(layers=2)


def _largest(lm, tmp_path, mode: str, length: int, split: bool = True) -> tuple[int, int, str]:
    """``(largest tensor bytes, prompt tokens, where)`` over one trial of ``mode`` at ``length``."""
    request = headprobe.ProfileRequest(
        probes=["retrieval_reasoning"], lengths=[length], depths=[0.5], out_dir=tmp_path / f"{mode}{length}{split}",
        mode=mode, needle_ids=["q01"], chat_template=False, gate="likelihood", split_attention=split)
    with LargestTensor() as watch:
        result = headprobe.run_profile(lm, request)
    _, records = headprobe.read_log(result.logs[0])
    assert result.trials_run == 1
    return watch.bytes, records[0]["prompt_tokens"], watch.where


@pytest.mark.parametrize("mode", ["fast", "reference"])
def test_largest_tensor_of_a_trial_grows_linearly_with_the_prompt(tiny, tmp_path, one_thread, mode):
    (small, n_small, _), (large, n_large, where) = (_largest(tiny, tmp_path, mode, n) for n in LENGTHS)
    assert n_large > 1.9 * n_small
    growth = large / small
    assert growth < 1.3 * n_large / n_small, f"{mode}: largest tensor grew {growth:.2f}x ({where})"
    assert large < n_large * n_large, f"{mode}: {large} bytes >= prompt² ({where})"


def test_masked_prompt_forward_is_the_quadratic_control(tiny, tmp_path, one_thread):
    (small, n_small, _), (large, n_large, where) = (_largest(tiny, tmp_path, "fast", n, split=False) for n in LENGTHS)
    assert large / small > 1.5 * n_large / n_small, where
