"""The command line (exit codes, one-line errors, JSON) and the tolerance table."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from maskcheck.harness.cli import main
from maskcheck.harness.engine.tolerance import (
    EPS,
    Tolerance,
    compare_logits,
    compare_rows,
    tolerance_for,
)


def test_list_shows_suites_presets_and_seeded_bugs(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for word in ("causal", "loss_masking", "tiny-encoder-decoder", "causal_sees_next_token"):
        assert word in out


def test_audit_of_a_clean_model_exits_0_and_writes_json(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    report = tmp_path / "out" / "report.json"
    assert main(["audit", "ref:tiny-decoder", "-q", "--json", str(report)]) == 0
    out = capsys.readouterr().out
    # Random-init weights leave the norm layout inconclusive: a warn, which exits 0.
    assert "verdict: WARN" in out and "causal" in out and "inconclusive" in out
    data = json.loads(report.read_text())
    assert data["schema_version"] == 1 and data["model"] == "ref:tiny-decoder"
    assert {s["name"]: s["status"] for s in data["suites"]} == {
        "causal": "pass",
        "padding": "pass",
        "cross_attention": "not_applicable",
        "loss_masking": "pass",
        "packing": "pass",
        "kv_cache": "pass",
        "serving": "pass",
        "norm_checkpoint": "warn",
    }
    check = data["suites"][0]["checks"][0]
    assert set(check) >= {"name", "status", "max_diff", "floor", "threshold", "positions", "message"}


def test_audit_of_a_seeded_bug_exits_1_with_the_shrunk_case(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["audit", "mutant:padding_mask_ignored", "--suites", "padding", "-q"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "padding/pad_ids: changing the ids" in out and "shrunk case: {" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["audit", "nope:x"], "unknown spec scheme"),
        (["audit", "ref:tiny-decoder", "--suites", "causal,bogus"], "unknown suite(s) bogus"),
        (["audit", "hf:/does/not/exist"], "no such directory"),
    ],
)
def test_usage_and_loading_errors_are_one_line_with_exit_2(argv, message, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and err.count("\n") == 0 and "Traceback" not in err


def test_nothing_applicable_exits_2(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["audit", "ref:tiny-decoder", "--suites", "cross_attention", "-q"]) == 2


def test_console_script_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "maskcheck.harness.cli", "audit", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for option in (
        "--suites",
        "--device",
        "--dtype",
        "--attn-implementation",
        "--task",
        "--examples",
        "--seed",
        "--json",
    ):
        assert option in out


def test_importing_the_plugin_does_not_import_torch() -> None:
    code = "import sys, maskcheck, maskcheck.harness.plugin; print('torch' in sys.modules)"
    assert (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
        == "False"
    )


def test_tolerance_table_selection_and_overrides() -> None:
    assert tolerance_for("cpu", "float32") == Tolerance(8, 4, 32)
    assert tolerance_for("cuda:1", "bfloat16") == tolerance_for("cpu", "bfloat16")
    custom = tolerance_for("cpu", "float32", {"cpu.float32": {"shape_change_ulps": 64}})
    assert custom.shape_change_ulps == 64 and custom.same_shape_ulps == 8
    with pytest.raises(ValueError, match="no tolerance"):
        tolerance_for("cpu", "int8")
    # Lower precision, looser threshold, for the same nonzero floor and scale; at floor 0 (a
    # bitwise-reproducible kernel) the arithmetic term is float32's in any dtype.
    t32, t16 = tolerance_for("cpu", "float32"), tolerance_for("cpu", "bfloat16")
    assert t16.same_shape(1e-6, "bfloat16", 5) > t32.same_shape(1e-6, "float32", 5)
    assert t16.same_shape(0, "bfloat16", 5) <= t32.same_shape(0, "float32", 5)
    assert t32.shape_change(1e-6, "float32", 1) == pytest.approx(4e-6 + 32 * EPS["float32"])


def test_compare_logits_only_at_compared_positions_and_flags_nan() -> None:
    reference = torch.zeros(1, 3, 4)
    test = reference.clone()
    test[0, 2] = torch.tensor([5.0, 0, 0, 0])  # differs only at an uncompared position
    where = torch.tensor([[True, True, False]])
    assert compare_logits(reference, test, where).max_diff == 0
    test[0, 1, 0] = 1.0
    moved = compare_logits(reference, test, where)
    assert moved.positions_over(0.1) == [[0, 1]] and moved.positions_over(moved.max_diff) == []
    assert moved.per_position[0, 1] == moved.max_diff > 0 and moved.per_position[0, 0] == moved.per_position[0, 2] == 0
    test[0, 1, 0] = float("nan")
    comparison = compare_logits(reference, test, where)
    assert comparison.nonfinite == [[0, 1]] and comparison.max_diff == float("inf")
    # Bitwise-equal logits are not a pass when they are not finite: the same inf (or all inf) on both sides fails.
    for bad in (torch.tensor([float("inf"), 0, 0, 0]), torch.full((4,), float("-inf")), torch.full((4,), float("inf"))):
        both = torch.zeros(1, 3, 4)
        both[0, 1] = bad
        comparison = compare_logits(both, both.clone(), where)
        assert comparison.nonfinite == [[0, 1]] and comparison.max_diff == float("inf"), bad


def test_scale_is_the_largest_compared_logit_or_log_probability() -> None:
    generator = torch.Generator().manual_seed(0)
    reference = 3 * torch.randn(5, 7, generator=generator)
    reference[0, 0] = -40.0  # its log-probability, below -40, is the largest magnitude: the scale
    logprobs = torch.log_softmax(reference.double(), -1)
    expected = max(float(reference.abs().max()), float(-logprobs.min()))
    differing = reference + 1e-3 * torch.randn(5, 7, generator=generator)
    for test in (reference.clone(), differing):  # the bitwise-equal path and the float64 one
        _, _, scale = compare_rows(reference, test)
        assert scale == pytest.approx(expected, rel=1e-6)
        _, _, raw_scale = compare_rows(reference, test, normalise=False)
        assert raw_scale == pytest.approx(float(reference.abs().max()), rel=1e-6)
    # A row whose test side is not finite leaves the scale to the others.
    broken = differing.clone()
    broken[0, 3] = float("nan")
    diff, worst, scale = compare_rows(reference, broken)
    assert diff[0] == worst == float("inf") and scale == pytest.approx(
        max(float(reference[1:].abs().max()), float(-logprobs[1:].min())), rel=1e-6
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
def test_cuda_bfloat16_audit_runs() -> None:  # pragma: no cover - exercised on a GPU machine
    assert main(["audit", "ref:tiny-decoder", "--device", "cuda", "--dtype", "bfloat16", "-q"]) == 0


def test_bfloat16_audit_on_cpu_catches_a_leak_and_passes_clean() -> None:
    assert main(["audit", "ref:tiny-decoder", "--dtype", "bfloat16", "-q"]) == 0
    assert main(["audit", "mutant:causal_sees_next_token", "--dtype", "bfloat16", "--suites", "causal", "-q"]) == 1


def test_tolerance_from_pyproject_reaches_the_audit(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "pyproject.toml").write_text(
        '[tool.maskcheck.tolerance."cpu.float32"]\nshape_change_ulps = 1000\nsame_shape_ulps = 1000\n'
    )
    monkeypatch.chdir(tmp_path)
    report = tmp_path / "r.json"
    assert main(["audit", "ref:tiny-decoder", "--suites", "causal", "-q", "--json", str(report)]) == 0
    threshold = json.loads(report.read_text())["suites"][0]["checks"][0]["threshold"]
    assert threshold > 100 * 2**-23, "the configured ulps were used"
    (tmp_path / "pyproject.toml").write_text("[tool.maskcheck]\ntolerance = 3\n")
    assert main(["audit", "ref:tiny-decoder", "-q"]) == 2
    assert "tolerance has the wrong type" in capsys.readouterr().err


def test_low_precision_audits_measure_their_float32_reference_error() -> None:
    """FlashAttention's rule, per audit: a bf16 model is compared with its float32 twin once,
    and twice that error joins the shape-changing threshold."""
    from maskcheck import LoadOptions, audit
    from maskcheck.harness.engine.tolerance import EPS, Tolerance

    result = audit("ref:tiny-decoder", ["padding"], options=LoadOptions(dtype="bfloat16"))
    error = result.environment["float32_reference_error"]
    assert error is not None and 0 < error < 8  # a fraction of bf16's eps * scale for this model
    assert result.suite("padding").status == "pass"
    assert audit("ref:tiny-decoder", ["causal"]).environment["float32_reference_error"] is None
    with_error = Tolerance(same_shape_ulps=2, shape_change_k=4, shape_change_ulps=8, reference_error=3.0)
    assert with_error.shape_change(0.0, "bfloat16", 1.0) == pytest.approx((8 + 2 * 3.0) * EPS["bfloat16"])
