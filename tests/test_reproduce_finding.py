"""scripts/sweep/reproduce_finding.py decides a small difference in float64: rounding shrinks
there, a behaviour keeps its size (the rule every confirmation in docs/architectures.md
rests on)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "sweep" / "reproduce_finding.py"


@pytest.fixture(scope="module")
def script() -> ModuleType:
    if str(SCRIPT.parent) not in sys.path:  # its sibling modules, on the path as when it runs as a script
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("reproduce_finding", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reordered_sum(script: ModuleType):  # type: ignore[no-untyped-def]
    """A comparison across shapes of a correct computation: the same numbers summed in two
    orders, in the model's dtype (about 1e-6 apart in float32, 1e-14 in float64)."""

    def check(model: torch.nn.Module, task: str) -> tuple[float, bool]:
        dtype = next(model.parameters()).dtype
        x = torch.randn(4096, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(dtype)
        difference = float((x.sum() - x.flip(0).sum()).abs())
        return difference, script.beyond_rounding(difference, model)

    return check


def fixed_behaviour(size: float, script: ModuleType):  # type: ignore[no-untyped-def]
    def check(model: torch.nn.Module, task: str) -> tuple[float, bool]:
        return size, script.beyond_rounding(size, model)

    return check


def test_a_small_behaviour_is_a_finding_in_float64(script: ModuleType) -> None:
    check = fixed_behaviour(6.8e-5, script)  # XLM's stale cache at width 64
    difference, finding = check(torch.nn.Linear(1, 1), "causal-lm")
    assert not finding  # below the float32 bar
    assert script.remeasured_in_float64(torch.nn.Linear(1, 1), check, "causal-lm", difference) == (6.8e-5, True)


def test_rounding_is_not_a_finding_in_float64(script: ModuleType) -> None:
    check = reordered_sum(script)
    in_float32, _ = check(torch.nn.Linear(1, 1), "causal-lm")
    assert 0.0 < in_float32 < 1e-4
    in_float64, finding = script.remeasured_in_float64(torch.nn.Linear(1, 1), check, "causal-lm", in_float32)
    assert not finding and in_float64 < in_float32 / 1e3


def test_a_same_shape_difference_that_shrinks_in_float64_is_rounding(script: ModuleType) -> None:
    """A same-shape check finds any difference; a mixture-of-experts layer reorders its sums
    with the batch, so its float32 difference must keep its size in float64 to count."""

    def same_shape(model: torch.nn.Module, task: str) -> tuple[float, bool]:
        difference, _ = reordered_sum(script)(model, task)
        return difference, difference > 0.0

    in_float32, finding = same_shape(torch.nn.Linear(1, 1), "causal-lm")
    assert finding
    assert script.remeasured_in_float64(torch.nn.Linear(1, 1), same_shape, "causal-lm", in_float32)[1] is False


def test_a_model_that_refuses_float64_keeps_its_float32_result(
    script: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuses(model: torch.nn.Module, task: str) -> tuple[float, bool]:
        if next(model.parameters()).dtype == torch.float64:
            raise RuntimeError("Expected mat_a to be Float32, got Double")
        return 1e-5, False

    assert script.remeasured_in_float64(torch.nn.Linear(1, 1), refuses, "causal-lm", 1e-5) is None
    assert "does not run in float64" in capsys.readouterr().out

    def not_finite(model: torch.nn.Module, task: str) -> tuple[float, bool]:
        return float("nan"), False

    assert script.remeasured_in_float64(torch.nn.Linear(1, 1), not_finite, "causal-lm", 1e-5) is None


def test_the_plain_serving_check_holds_on_a_clean_cache_and_finds_a_seeded_one(
    script: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """The sweep's serving verdicts are confirmed by plain transformers calls; they can fail:
    a cache layer that reorders keys and not values, or crops keys and not values."""
    from maskcheck.reference_models import serving_bugs
    from maskcheck.reference_models.hf_tiny import tiny_model

    difference, finding = script.serving(tiny_model("llama"), "causal-lm")
    assert not finding and difference < 1e-4, capsys.readouterr().out
    for layer, line in (
        (serving_bugs.ReorderKeysOnlyLayer, "reorder_cache"),
        (serving_bugs.CropKeepsValuesLayer, "crop(-1)"),
    ):
        model = serving_bugs.with_cache_layer(tiny_model("llama"), layer)
        capsys.readouterr()
        difference, finding = script.serving(model, "causal-lm")
        printed = capsys.readouterr().out
        assert finding and difference > 1e-2, printed
        assert any(line in row and float(row.rsplit("= ", 1)[1]) > 1e-2 for row in printed.splitlines()), printed
