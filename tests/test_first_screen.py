"""What a newcomer sees first, in the project's own environment: maskcheck's own line comes
first, and a usage error is that one line, with no third-party line before it (a library's
failed extension loads, torch's deprecation warnings, a progress bar)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest


def maskcheck(*argv: str, cwd: Path) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [sys.executable, "-m", "maskcheck", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env=environment,
    )


@pytest.fixture(scope="module")
def user_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user's module that imports transformers models (as most do), a checkpoint directory,
    and a directory whose config names no model type transformers knows."""
    from maskcheck.reference_models.hf_tiny import tiny_model

    root = tmp_path_factory.mktemp("user_repo")
    (root / "my_models.py").write_text(
        "from transformers import LlamaConfig, LlamaForCausalLM\n\n\n"
        "def decoder():\n    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, hidden_size=32)).eval()\n"
    )
    tiny_model("gpt2").save_pretrained(root / "checkpoint")
    (root / "broken").mkdir()
    (root / "broken" / "config.json").write_text('{"model_type": "no_such_model_type"}')
    return root


@pytest.mark.parametrize(
    "argv",
    [
        ("audit", "module:my_models:no_such_factory"),  # imports transformers first
        ("audit", "hf:broken"),  # transformers reads the config
        ("audit", "hf:checkpoint", "--suites", "no_such_suite"),
        ("audit", "hf:checkpoint", "--profile", "no_such_profile"),
    ],
    ids=["module-factory", "hf-config", "hf-suite", "hf-profile"],
)
def test_a_usage_error_is_one_line_of_maskcheck_and_nothing_before_it(argv: tuple[str, ...], user_repo: Path) -> None:
    completed = maskcheck(*argv, cwd=user_repo)
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("maskcheck"), completed.stderr
    assert completed.stdout == "", completed.stdout


def test_an_audit_prints_maskcheck_first(user_repo: Path) -> None:
    completed = maskcheck("audit", "hf:checkpoint", "--suites", "causal", "-q", cwd=user_repo)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert completed.stdout.startswith("maskcheck audit of hf:checkpoint"), completed.stdout[:500]
    assert completed.stderr.strip() == "", completed.stderr  # no warning, bar or failed load beside it
