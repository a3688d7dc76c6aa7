"""Reproduction of a maskcheck collator finding: run with pytest (or python) in this directory.

case.json holds, per failing check, the shrunk list of examples; each is collated again by the
collator's factory and checked again, printing the batch.
"""

import json
from pathlib import Path

import pytest

from maskcheck.harness.collator_audit import replay_collator_case

DATA = json.loads((Path(__file__).parent / "case.json").read_text())


@pytest.mark.parametrize("index", range(len(DATA["cases"])), ids=[c["check"] for c in DATA["cases"]])
def test_repro_collator(index: int) -> None:
    outcome, batch = replay_collator_case(DATA, index)
    print(DATA["cases"][index]["examples"], "->", batch)
    assert outcome.status != "fail", outcome.message


if __name__ == "__main__":
    for i, case in enumerate(DATA["cases"]):
        outcome, batch = replay_collator_case(DATA, i)
        print(case["check"], case["examples"], "->", batch, "\n ", outcome.status, outcome.message)
