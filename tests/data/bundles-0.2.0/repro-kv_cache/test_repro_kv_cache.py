"""Reproduction of a maskcheck failure: suite 'kv_cache' on mutant:kv_cache_positions_restart.

Run it with plain pytest, from any directory:  pytest test_repro_kv_cache.py
Each test replays one shrunk case and fails with the message maskcheck reported. A model
that cannot be rebuilt is an ERROR of the test's setup, never a FAIL.
Written by maskcheck 0.2.0.
"""

from pathlib import Path

import pytest

from maskcheck.harness.reproduction import replay_check, replay_model

BUNDLE = Path(__file__).resolve().parent
MODEL = None  # None: rebuilt from the spec recorded in case.json


@pytest.fixture(scope="module")
def model():
    try:
        return replay_model(BUNDLE, MODEL)
    except Exception as exc:
        pytest.fail(f"cannot rebuild the model to replay on: {exc}", pytrace=False)


@pytest.mark.parametrize("check", ['incremental', 'greedy_generation'])
def test_repro_kv_cache(check: str, model) -> None:
    result = replay_check(BUNDLE, check, model=model)
    if result.status == "fail":
        pytest.fail(result.report(), pytrace=False)
