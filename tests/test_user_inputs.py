"""The inputs users give: labels as collators build them, lengths up to the model's
context, and low precision.

Each seeded bug here was missed by the commit before these changes (a5251a5), audited
under both ``dev`` and ``ci``: ``loss_counted_before_shift`` passed ``loss_masking`` (its
labels had each row's first token at -100, so counting before the shift counted the same);
``causal_leaks_past_length`` passed ``causal`` (no case was longer than 16 tokens);
``bf16_faint_next_token``, declared bfloat16, passed ``causal`` with 0.0548 against a
threshold of 0.0844 (the bfloat16 arithmetic term).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from maskcheck import audit
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.paths import PATHS
from maskcheck.harness.engine.profiles import length_cap
from maskcheck.harness.engine.strategies import short_or_long
from maskcheck.harness.engine.tolerance import EPS, tolerance_for
from maskcheck.reference_models.hf_tiny import tiny_model
from maskcheck.reference_models.plain import plain_decoder
from maskcheck.reference_models.reference_bugs import LONG_FROM

pytestmark = pytest.mark.call_paths  # every call path (conftest.py)


def check_of(result, suite: str, name: str):  # type: ignore[no-untyped-def]
    return next(c for c in result.suite(suite).checks if c.name == name)


def test_a_normaliser_counted_before_the_shift_fails_under_collator_labels() -> None:
    check = check_of(audit("mutant:loss_counted_before_shift", ["loss_masking"]), "loss_masking", "reference_loss")
    assert check.status == "fail" and "counted before the shift" in check.message, check.message


@pytest.mark.parametrize("model", ["ref:tiny-decoder", "hf:gpt2", "hf:llama"])
def test_collator_labels_under_left_padding_leave_out_the_first_target_and_say_so(model: str) -> None:
    """labels = input_ids with -100 at padding make the last padded slot predict the first
    real token: a correct model's loss moves with the padded ids. That target is left out of
    the loss checks, which pass, and padded_inputs says why and what to do."""
    spec = HFAdapter(tiny_model(model.removeprefix("hf:"))) if model.startswith("hf:") else model
    suite = audit(spec, ["loss_masking"], paths=("canonical",)).suite("loss_masking")
    assert {c.name: c.status for c in suite.checks} == {
        "reference_loss": "pass",
        "ignored_logits": "pass",
        "padded_inputs": "pass",
        "extra_padding": "pass",
    }, [(c.name, c.message) for c in suite.checks]
    padded = next(c for c in suite.checks if c.name == "padded_inputs")
    assert "predict each row's first real token" in padded.message and "label it -100 too" in padded.message


def test_a_mask_wrong_only_past_some_length_is_caught_at_that_length() -> None:
    check = check_of(audit("mutant:causal_leaks_past_length", ["causal"]), "causal", "future_tokens")
    assert check.status == "fail" and check.case["length"] > LONG_FROM and check.case["cut"] >= LONG_FROM


def test_lengths_cap_per_profile_within_the_context() -> None:
    assert [length_cap(p, 10**6) for p in ("quick", "dev", "ci", "thorough")] == [128, 128, 256, 4096]
    assert length_cap("thorough", 1024) == 1024 and length_cap("ci", 64) == 64
    assert [length_cap(p, 10**6, cached=True) for p in ("dev", "ci", "thorough")] == [48, 96, 512]
    assert length_cap("ci", None) is None  # no declared context: short cases only


def test_short_and_long_lengths_are_both_drawn() -> None:
    seen: list[int] = []

    # Beside a seed, as in a case: a bare length would run out of distinct short values.
    @settings(max_examples=40, database=None, derandomize=True)
    @given(short_or_long(2, 16, 256), st.integers(0, 2**16))
    def draw(length: int, seed: int) -> None:
        seen.append(length)

    draw()
    assert min(seen) <= 16 and max(seen) > 128 and sum(n > 16 for n in seen) < len(seen) / 2, sorted(seen)
    assert short_or_long(2, 16, 10).validate() is None  # a context shorter than the short range: one range


def test_bfloat16_keeps_float32_thresholds_where_the_kernel_is_bitwise_reproducible() -> None:
    tolerance = tolerance_for("cpu", "bfloat16")
    assert tolerance.same_shape(0.0, "bfloat16", 5.0) == tolerance.same_shape_ulps * EPS["float32"] * 5.0
    assert tolerance.same_shape(1e-3, "bfloat16", 5.0) == 2e-3 + tolerance.same_shape_ulps * EPS["bfloat16"] * 5.0


def test_a_clean_bfloat16_gpt2_neither_warns_nor_hides_its_packing_leak() -> None:
    """In bfloat16 the width-32 GPT-2 got a causal warn ("influence reaches back only 0
    positions") and its packing settings passed, where float32 reports the leak of the
    default-cache setting; both now read as in float32."""
    result = audit(HFAdapter(tiny_model("gpt2").to(torch.bfloat16)), ["causal", "packing"], paths=("canonical",))
    assert check_of(result, "causal", "declared_pattern").status == "pass"
    settings_check = check_of(result, "packing", "settings")
    assert settings_check.status == "warn" and "It leaks with" in settings_check.message, settings_check.message


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_low_precision_cache_bug_below_the_dtype_rounding_fails_on_its_float32_twin(dtype: torch.dtype) -> None:
    """Cached against full is a comparison across shapes, whose bfloat16 threshold (0.28 here)
    is larger than this leak: the model itself passes, its float32 copy fails, and the
    verdict says on which path."""
    from maskcheck.reference_models.mutants import build, build_clean

    bug = audit(build("kv_cache_positions_restart").to(dtype), ["kv_cache"])
    incremental = next(c for c in bug.suite("kv_cache").checks if c.name == "incremental")
    by_path = {p["path"]: p["status"] for p in incremental.paths}
    assert by_path["canonical"] == "pass" and by_path["float32_twin"] == "fail", by_path
    assert incremental.status == "fail" and incremental.message.startswith("on the float32_twin path")
    clean = audit(build_clean("kv_cache_positions_restart").to(dtype), ["kv_cache"])
    assert clean.suite("kv_cache").status == "pass"


def test_the_float32_twin_runs_only_for_low_precision_models_and_says_why_it_cannot() -> None:
    from maskcheck.harness.adapters.specs import adapter_for

    float32 = adapter_for(plain_decoder())
    assert "float32_twin" not in [a.path.name for a in float32.paths()]
    bf16 = adapter_for(plain_decoder().to(torch.bfloat16))
    twin = {a.path.name: a.reason for a in bf16.paths()}
    assert "float32_twin" in twin and twin["float32_twin"] is None
    assert bf16.on_path(PATHS["float32_twin"]).capabilities.dtype == "float32"
    assert next(bf16.model.parameters()).dtype == torch.bfloat16  # the model itself is untouched
    canonical_only = adapter_for(plain_decoder().to(torch.bfloat16))
    audit(canonical_only, ["causal"], paths=("canonical",))
    assert "_float32_twin" not in canonical_only.__dict__  # no path ran on it: not kept beside the model
