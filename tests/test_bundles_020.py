"""Bundles written by maskcheck 0.2.0 replay with this version: they import
``maskcheck.harness.reproduction`` and ``maskcheck.harness.collator_audit`` by name, paths
the layout moved and keeps as shims. Each bundle (tests/data/bundles-0.2.0) reproduces a
seeded bug, so replayed from another directory it must fail with the recorded message."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUNDLES = Path(__file__).with_name("data") / "bundles-0.2.0"


@pytest.mark.parametrize("name", sorted(p.name for p in BUNDLES.iterdir()))
def test_a_020_bundle_fails_with_its_recorded_message(name: str, tmp_path: Path) -> None:
    bundle = shutil.copytree(BUNDLES / name, tmp_path / name)
    case = json.loads((bundle / "case.json").read_text())
    if case.get("import_root"):  # the factory lived in the auditing repository: here, this one
        case["import_root"] = str(ROOT)
        (bundle / "case.json").write_text(json.dumps(case))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(bundle)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    recorded = (
        [c["outcome"]["message"] for c in case["checks"]] if "checks" in case else [c["message"] for c in case["cases"]]
    )
    assert recorded and all(" ".join(m.split())[:60] in " ".join(done.stdout.split()) for m in recorded), done.stdout[
        -3000:
    ]
