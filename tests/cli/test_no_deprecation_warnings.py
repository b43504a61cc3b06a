"""The default paths (profile, allocate, generate, eval) print no deprecation warning.

Each command runs as a user runs it, in its own interpreter, with every ``FutureWarning`` and
``DeprecationWarning`` turned into an error (``-W error``): a warning that transformers or torch raises for
how headprobe calls them (``past_key_values`` renamed to ``cache`` in transformers 5.24, say) fails the
command, and the test. The output is also checked for any warning text at all.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

WARNINGS_AS_ERRORS = ["-W", "error::FutureWarning", "-W", "error::DeprecationWarning"]


def _headprobe(*argv: str, cwd) -> subprocess.CompletedProcess:
    code = "import sys; from headprobe_cli.main import main; sys.exit(main(sys.argv[1:]))"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("PYTHONWARNINGS", None)
    return subprocess.run([sys.executable, *WARNINGS_AS_ERRORS, "-c", code, *argv], check=False, cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def _clean(result: subprocess.CompletedProcess, what: str, expect_error: str | None = None) -> None:
    output = result.stdout + result.stderr
    if expect_error is None:
        assert result.returncode == 0, f"{what}: rc {result.returncode}\n{output[-3000:]}"
    else:
        assert result.returncode == 2 and expect_error in result.stderr, output[-3000:]
    assert "Warning" not in output, f"{what} printed a warning:\n{output[-3000:]}"


def test_tiny_model_profile_allocate_generate_eval_print_no_warning(tiny_dir, tmp_path):
    """The random tiny model runs every trial but answers nothing, so its profile run ends on the gate's
    one-line error; the profile allocate reads is a random one of its shape."""
    import conftest

    import headprobe

    model = ["--model", str(tiny_dir), "--device", "cpu"]
    _clean(_headprobe("profile", *model, "--probe", "retrieval", "--lengths", "300", "--depths", "0", "100",
                      "--needles", "r01", "--no-chat-template", "--out-dir", "p", cwd=tmp_path), "profile",
           expect_error="none of the 2 trials passed")
    assert len((tmp_path / "p" / "tiny.retrieval.trials.jsonl").read_text().splitlines()) == 3
    conftest.write_random_profile(headprobe.load_model(str(tiny_dir), device="cpu"), "retrieval",
                                  tmp_path / "p.json")
    _clean(_headprobe("allocate", "--profile", "p.json", "--capacity", "16", "-o", "b.json", cwd=tmp_path),
           "allocate")
    _clean(_headprobe("generate", *model, "--budget", "b.json", "--max-new-tokens", "4", "--no-chat",
                      "The secret code is blue tulip seven. The secret code is", cwd=tmp_path), "generate")
    _clean(_headprobe("eval", *model, "--settings", "full", "snapkv", "--capacities", "64", "--lengths", "300",
                      "--depths", "50", "--needle-ids", "r01", "--max-new-tokens", "2", "--no-chat-template",
                      "--out", "e.json", cwd=tmp_path), "eval")


@pytest.mark.slow
def test_readme_profile_on_the_default_model_prints_no_warning(tmp_path):
    """README command 1's ``headprobe profile`` (the embedded SmolLM2, its GGUF load included) on a small grid."""
    _clean(_headprobe("profile", "--device", "cpu", "--lengths", "300", "--depths", "50", "--needles", "r01",
                      "q01", "--samples-per-task", "1", "--out-dir", "p", cwd=tmp_path), "profile")
    _clean(_headprobe("allocate", "--beta", "1.01", "--profile", str(next((tmp_path / "p").glob(
        "*.retrieval_reasoning.json"))), "-o", "b.json", cwd=tmp_path), "allocate")
