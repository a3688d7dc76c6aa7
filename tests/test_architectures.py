"""The architecture sweep's fixes and its CI subset: shrunk random-init models of the
installed transformers, audited in-process, against the verdicts docs/architectures.md records."""

from __future__ import annotations

from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.reference_models.hf_tiny import shrunk_model

from maskcheck import audit


def test_a_documented_label_convention_is_a_warn_with_its_reason_and_can_be_turned_off() -> None:
    bart = shrunk_model("bart", "causal-lm")
    check = audit(HFAdapter(bart), ["loss_masking"]).suite("loss_masking").checks[0]
    assert check.name == "reference_loss" and check.status == "warn"
    assert check.message.startswith("documented convention of BartForCausalLM (unshifted-causal-lm-labels)")
    assert "it matches a loss with targets not shifted" in check.message  # the measurement behind it stays
    strict = audit(HFAdapter(bart), ["loss_masking"], disabled_conventions=["unshifted-causal-lm-labels"])
    assert strict.suite("loss_masking").checks[0].status == "fail"


def test_a_convention_never_covers_a_seeded_loss_bug() -> None:
    """The convention names classes and the measurement; a causal LM that drops the shift is still a bug."""
    assert audit("mutant:loss_without_shift", ["loss_masking"]).suite("loss_masking").status == "fail"


def test_a_model_that_ignores_its_mask_is_not_excused_by_positions() -> None:
    """RWKV has no positions and ignores attention_mask: pad ids move real logits, so the
    left-padding checks fail as a mask leak instead of blaming shifted positions."""
    checks = {c.name: c for c in audit(HFAdapter(shrunk_model("rwkv", "causal-lm")), ["padding"]).suite("padding").checks}
    assert checks["pad_ids"].status == "fail"
    for name in ("padded_vs_unpadded", "extra_padding"):
        assert checks[name].status == "fail" and "the padding mask is not applied" in checks[name].message
        assert "not a mask leak" not in checks[name].message
