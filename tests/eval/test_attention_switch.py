"""HeadAblation and RowRecorder share one attention switch: it restores the model and the active state on
exit, after an error too, and blocks of the two nest."""

import pytest
import torch

from headprobe.attention.recorder import RowRecorder
from headprobe.eval.ablation import HeadAblation

torch.set_num_threads(1)


def _ids(lm, n=20):
    torch.manual_seed(2)
    return torch.randint(3, lm.model.config.vocab_size, (1, n))


def test_an_error_inside_the_block_restores_everything(tiny_llama):
    model = tiny_llama.model
    with pytest.raises(RuntimeError, match="inside"), HeadAblation(model, [(0, 0)]) as abl:
        assert model.config._attn_implementation == "headprobe_ablate" and HeadAblation.active() is abl
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"
    assert HeadAblation.active() is None and RowRecorder.active() is None


def test_a_recorder_block_inside_an_ablation_block_hands_the_model_back(tiny_llama):
    model, ids = tiny_llama.model, _ids(tiny_llama)
    heads = [(1, 0), (3, 2)]
    with torch.no_grad():
        stock = model(ids).logits
        with HeadAblation(model, heads) as abl:
            ablated = model(ids).logits
            with RowRecorder(model) as rec:
                assert model.config._attn_implementation == "headprobe_rows"
                assert RowRecorder.active() is rec and HeadAblation.active() is abl
                recorded = model(ids).logits           # the recorder's implementation: no head masked
            assert model.config._attn_implementation == "headprobe_ablate" and RowRecorder.active() is None
            again = model(ids).logits
    assert not torch.allclose(ablated, stock, atol=1e-4)
    torch.testing.assert_close(recorded, stock, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again, ablated, rtol=0, atol=0)
    assert model.config._attn_implementation == "sdpa" and HeadAblation.active() is None
