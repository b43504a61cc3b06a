"""Library errors name parameters as a Python caller passes them; `headprobe profile` spells them as its flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from headprobe_cli import cmd_profile

from headprobe import HeadprobeError, NoPassingTrialsError, ProfileRequest, load_haystack
from headprobe.errors import flag_spelling
from headprobe.models.identity import ModelIdentity
from headprobe.probes.aggregate import needle_profile
from headprobe.probes.plan import check_profile_run
from headprobe.probes.request import check_request
from headprobe.probes.trial_grid import parse_shard


def _request(**kw) -> ProfileRequest:
    return ProfileRequest(**{"probes": ["retrieval"], "lengths": [500], "depths": [0.5], "out_dir": Path("."), **kw})


def _no_passing_trial():
    identity = ModelIdentity("m", "test", "llama", 1, 1, 1, 4, ("full_attention",))
    record = {"needle": "q01", "gates": {"published": False, "likelihood": False}}
    needle_profile("retrieval_reasoning", identity, {}, [record])


def _message(call) -> str:
    with pytest.raises(HeadprobeError) as info:
        call()
    return str(info.value)


CASES = [
    (lambda: check_request(_request(probes=["retrievl"])),
     "probes='retrievl': unknown probe", "--probe retrievl: unknown probe"),
    (lambda: check_request(_request(mode="slow")),
     "mode='slow': expected fast or reference", "--mode slow: expected fast or reference"),
    (lambda: check_request(_request(batch_size=0)),
     "batch_size: expected a positive integer", "--batch-size: expected a positive integer"),
    (lambda: check_request(_request(grid="huge")),
     "grid='huge': expected one of auto, cpu, full", "--grid huge: expected one of auto, cpu, full"),
    (lambda: check_profile_run(_request(needle_ids=["zz"]), "m"),
     "needle_ids: none of zz", "--needles: none of zz"),
    (lambda: parse_shard("3/2"),
     "shard='3/2': expected 0 <= i < n", "--shard 3/2: expected 0 <= i < n"),
    (lambda: load_haystack("/no/such/haystack"),
     "haystack='/no/such/haystack': no such", "--haystack /no/such/haystack: no such"),
    (_no_passing_trial,
     "try shorter lengths, other needle_ids or gate='likelihood'",
     "try shorter --lengths, other --needles or --gate likelihood"),
]


@pytest.mark.parametrize(("call", "library", "flags"), CASES)
def test_library_and_flag_spelling(call, library, flags):
    assert library in _message(call)
    with flag_spelling(cmd_profile.FLAGS):
        message = _message(call)
    assert flags in message and "=" not in message.split(":")[0]


def test_no_passing_trial_is_its_own_error():
    with pytest.raises(NoPassingTrialsError):
        _no_passing_trial()
