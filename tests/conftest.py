"""Shared fixtures: a tiny random Llama for plumbing tests, the real SmolLM2 for slow tests, a private user data
folder for every test, and the command line as an interruptible subprocess."""

from __future__ import annotations

import sys

import pytest
import torch

from headprobe.models.identity import ModelIdentity, identity_from_config
from headprobe.models.loading import LoadedModel

#: Two question-answering rows in LongBench's field names, for dataset-eval tests.
QA_ROWS = {
    "context": ["The lighthouse keeper kept a red notebook. " * 30, "The baker rose at four every morning. " * 30],
    "input": ["What colour was the notebook?", "When did the baker rise?"],
    "answers": [["red"], ["at four", "four"]],
    "_id": ["q1", "q2"],
}

#: SmolLM2-135M-Instruct's shape, for tests of files made for it that need not load the model.
SMOLLM2_IDENTITY = ModelIdentity(name="HuggingFaceTB/SmolLM2-135M-Instruct", source="test", architecture="llama",
                                 num_layers=30, num_query_heads=9, num_kv_heads=3, head_dim=64,
                                 layer_types=("full_attention",) * 30)

_TINY_TEXT = (
    "The river ran past the old mill. Fishermen waited on the bank while the rain came down. "
    "In the valley the farmers counted their sheep and sold wool in the market every Tuesday. "
    "Numbers like 42, 1979 and 3.14 appear in reports. The secret code is blue tulip seven. "
) * 4


def _tiny_tokenizer():
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator([_TINY_TEXT], vocab_size=400, min_frequency=1, special_tokens=["<s>", "</s>", "<pad>"])
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>")
    return tok


def make_tiny_llama(layers: int = 4, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                    seed: int = 0) -> LoadedModel:
    """A random Llama with a small trained BPE tokenizer: shapes and plumbing only, no quality."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = _tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=heads * head_dim, intermediate_size=2 * heads * head_dim,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         head_dim=head_dim, max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    return LoadedModel(model=model, tokenizer=tok, identity=identity_from_config(config, "tiny-llama", "test"))


def make_tiny_gemma3(seed: int = 0) -> LoadedModel:
    """A random Gemma 3 text model with sliding-window and global layers (window 16)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    tok = _tiny_tokenizer()
    config = Gemma3TextConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                              num_attention_heads=4, num_key_value_heads=1, head_dim=16, sliding_window=16,
                              layer_types=["sliding_attention", "sliding_attention", "sliding_attention",
                                           "full_attention"],
                              max_position_embeddings=4096, bos_token_id=tok.bos_token_id,
                              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    return LoadedModel(model=model, tokenizer=tok, identity=identity_from_config(config, "tiny-gemma3", "test"))


def headprobe_command(*argv: str) -> list[str]:
    """The ``headprobe`` command line as a subprocess that Ctrl-C (SIGINT) interrupts even when the tests run
    in the background, whose children start with SIGINT ignored."""
    code = ("import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
            "from headprobe_cli.main import main; sys.exit(main(sys.argv[1:]))")
    return [sys.executable, "-c", code, *argv]


@pytest.fixture(autouse=True)
def user_data_dir(tmp_path_factory, monkeypatch):
    """Every test gets its own user data folder (``HEADPROBE_DATA``), where ``headprobe profile`` writes by
    default and ``allocate`` looks first: tests never touch, nor read, the real one."""
    path = tmp_path_factory.mktemp("headprobe-data")
    monkeypatch.setenv("HEADPROBE_DATA", str(path))
    return path


def save_tiny_llama(folder) -> object:
    """Save :func:`make_tiny_llama`'s model and tokenizer to ``folder`` (a model folder ``--model`` takes)."""
    lm = make_tiny_llama()
    lm.model.save_pretrained(folder)
    lm.tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A model folder named ``tiny`` holding the tiny Llama, shared by the tests that load it by path."""
    return save_tiny_llama(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture
def tiny_llama() -> LoadedModel:
    return make_tiny_llama()


@pytest.fixture
def tiny_gemma3() -> LoadedModel:
    return make_tiny_gemma3()


@pytest.fixture(scope="session")
def smollm2() -> LoadedModel:
    """The real SmolLM2-135M-Instruct (float32, CPU), loaded once per test session."""
    from headprobe import load_model

    torch.set_num_threads(max(1, torch.get_num_threads()))
    return load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def gemma3() -> LoadedModel:
    """The real Gemma 3 270M (float32, CPU), loaded once per test session; skipped where its model package
    is not installed."""
    from headprobe import HeadprobeError, load_model

    try:
        return load_model("gemma3-270m", device="cpu")
    except HeadprobeError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def one_thread():
    """Run a test with one torch thread: small models are dominated by per-op overhead, and on small shared
    CPUs extra threads only contend (several times faster here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def write_random_profile(lm: LoadedModel, kind: str, path, seed: int = 0) -> list[list[float]]:
    """Write a ``kind`` profile of ``lm`` with random query-head scores (KV heads by group mean) to ``path``,
    shaped like the shipped SmolLM2 profile of that kind; returns the ``[layers][query_heads]`` scores."""
    import numpy as np

    import headprobe
    from headprobe.profile import Profile

    shipped = Profile.load(headprobe.paths.shipped_profiles_dir() / f"smollm2-135m.{kind}.json")
    L, H = lm.identity.num_layers, lm.identity.num_query_heads
    scores = torch.rand(L, H, generator=torch.Generator().manual_seed(seed)).tolist()
    g = lm.identity.group_size
    obj = shipped.to_json()
    obj["model"] = lm.identity.to_json()
    obj["scores"] = {"query_heads": scores, "group_reduction": "mean",
                     "kv_heads": [[float(np.mean(r[i * g:(i + 1) * g])) for i in range(len(r) // g)] for r in scores]}
    obj.pop("fingerprint", None)
    path.parent.mkdir(parents=True, exist_ok=True)
    headprobe.frontend.atomic_write_json(path, obj)
    return scores
