"""Loss conventions: a label-smoothed cross-entropy is fitted and reported, never a false
alarm; what must hold in every convention (the loss does not read the logits of ignored
targets) is judged exactly, by the loss's gradient, on random-init models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from maskcheck import audit
from maskcheck.harness.report.render import render_table
from maskcheck.reference_models.mutants import MUTANTS
from maskcheck.reference_models.plain import plain_decoder

SMOOTHING = 0.1


def smoothed(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A causal LM's label-smoothed loss as fairseq and many recipes write it."""
    return F.cross_entropy(
        logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100, label_smoothing=SMOOTHING
    )


def smoothing_over_every_position(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The hand-written bug: the smoothing term averages over the ignored targets too."""
    flat, targets = logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten()
    nll = F.cross_entropy(flat, targets, ignore_index=-100)
    return (1 - SMOOTHING) * nll + SMOOTHING * -torch.log_softmax(flat, -1).mean()


def smoothed_over_all_targets(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Label-smoothed, but summed and divided by every target, ignored ones included."""
    flat, targets = logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten()
    total = F.cross_entropy(flat, targets, ignore_index=-100, label_smoothing=SMOOTHING, reduction="sum")
    return total / targets.numel()


def plain_with_loss(loss):  # type: ignore[no-untyped-def]
    model = plain_decoder()
    model.maskcheck_capabilities = {**model.maskcheck_capabilities, "has_loss": True}
    model.maskcheck_loss = loss
    return model


def checks_of(model) -> dict:  # type: ignore[no-untyped-def, type-arg]
    return {c.name: c for c in audit(model, ["loss_masking"], paths=("canonical",)).suite("loss_masking").checks}


@pytest.mark.parametrize("name", ["loss_smoothing_counts_ignored", "loss_smoothing_counts_ignored_seq2seq"])
def test_a_correct_label_smoothed_loss_passes_with_its_smoothing_fitted_and_reported(name: str) -> None:
    """The clean twins of the smoothing mutants: a decoder and an encoder-decoder."""
    result = audit(MUTANTS[name].clean(), ["loss_masking"], paths=("canonical",))
    suite = result.suite("loss_masking")
    assert suite.status == "pass", [(c.name, c.status, c.message) for c in suite.checks]
    reference = next(c for c in suite.checks if c.name == "reference_loss")
    assert reference.convention is not None and "label-smoothed cross-entropy, smoothing 0.1 " in reference.convention
    line = render_table(result, "smoothed", 1.0).splitlines()[2]
    assert "convention: reference_loss: label-smoothed cross-entropy, smoothing 0.1" in line, line


def test_a_plain_module_s_smoothed_loss_passes_and_its_hand_written_bug_fails_on_the_gradient() -> None:
    clean = checks_of(plain_with_loss(smoothed))
    assert {name: c.status for name, c in clean.items()} == dict.fromkeys(clean, "pass"), clean
    assert "smoothing 0.1" in (clean["reference_loss"].convention or "")
    bug = checks_of(plain_with_loss(smoothing_over_every_position))["ignored_logits"]
    assert bug.status == "fail" and "the loss reads the logits of positions whose target" in bug.message, bug
    assert bug.max_diff is not None and bug.threshold is not None and bug.max_diff > 100 * bug.threshold


def test_a_smoothed_loss_with_a_wrong_normaliser_fits_no_smoothing() -> None:
    reference = checks_of(plain_with_loss(smoothed_over_all_targets))["reference_loss"]
    assert reference.status == "fail" and "nor is it label-smoothed" in reference.message, reference.message


def test_an_unsmoothed_loss_reports_no_convention() -> None:
    checks = checks_of(MUTANTS["loss_counts_ignored"].clean())
    assert checks["reference_loss"].status == "pass" and checks["reference_loss"].convention is None
    assert checks["ignored_logits"].status == "pass" and checks["ignored_logits"].max_diff == 0.0
