"""The collator audit and the gradient-accumulation check: transformers' collators configured as
documented pass, the usual misconfigurations fail with what to change, every seeded collator
bug is caught by its check and shrinks to at most three examples, and a wrong loss
normaliser over accumulated micro-batches fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from maskcheck.harness.audits.collator_audit import (
    CollatorError,
    audit_collator,
    replay_collator_case,
)
from maskcheck.harness.audits.grad_accumulation import (
    assert_gradient_accumulation,
    check_gradient_accumulation,
)
from maskcheck.reference_models.collator_mutants import COLLATOR_MUTANTS
from maskcheck.reference_models.hf_tiny import tiny_model

ROOT = Path(__file__).resolve().parent.parent


def failing(result):  # type: ignore[no-untyped-def]
    return {c.name: c for c in result.suites[0].checks if c.status == "fail"}


@pytest.mark.parametrize(
    "factory, task",
    [("language_modeling", "causal-lm"), ("flattening", "packed"), ("seq2seq", "seq2seq")],
)
def test_transformers_collators_configured_as_documented_pass(factory: str, task: str) -> None:
    result = audit_collator(f"collator:examples.collators:{factory}", task, profile="ci")
    assert result.suites[0].status == "pass", {c.name: c.message for c in result.suites[0].checks}
    assert result.suites[0].cases > 20


def test_pad_equal_to_eos_masks_every_real_eos_and_says_what_to_change() -> None:
    check = failing(audit_collator("collator:examples.collators:pad_is_eos", "causal-lm"))["target_labels"]
    assert "real EOS token(s) (id 2, which is also the pad id), so the model never learns to stop" in check.message
    assert (
        "give the tokenizer a pad token distinct from EOS" in check.message
        and "mask labels by the attention mask" in check.message
    )
    assert [2] == [t for e in check.case["examples"] for t in e["input_ids"] if t == 2]  # the shrunk case holds one EOS


def test_labels_copied_from_padded_input_ids_fail_at_padding() -> None:
    check = failing(audit_collator("collator:examples.collators:labels_are_input_ids", "causal-lm"))["padding_labels"]
    assert (
        "so the loss trains the model to predict padding" in check.message
        and "set padded labels to -100" in check.message
    )


def test_seq2seq_labels_padded_with_the_pad_id_fail() -> None:
    check = failing(audit_collator("collator:examples.collators:seq2seq_labels_padded_with_pad_id", "seq2seq"))[
        "label_padding"
    ]
    assert "label_pad_token_id=-100" in check.message


@pytest.mark.parametrize("name", sorted(COLLATOR_MUTANTS))
def test_each_seeded_collator_bug_is_caught_by_its_check_and_shrinks(name: str) -> None:
    mutant = COLLATOR_MUTANTS[name]
    result = audit_collator(f"collator:maskcheck.reference_models.collator_mutants:{name}", mutant.task)
    fails = failing(result)
    assert mutant.check in fails, {c.name: (c.status, c.message) for c in result.suites[0].checks}
    assert len(fails[mutant.check].case["examples"]) <= 3


def test_a_failure_writes_a_bundle_that_replays_from_another_directory(tmp_path: Path) -> None:
    result = audit_collator(
        "collator:maskcheck.reference_models.collator_mutants:boundary_label_kept", "packed", bundle_dir=tmp_path
    )
    bundle = Path(result.suites[0].reproduction)
    data = json.loads((bundle / "case.json").read_text())
    assert data["kind"] == "collator" and data["task"] == "packed"
    outcome, batch = replay_collator_case(data, 0)
    assert outcome.status == "fail" and batch is not None
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(bundle)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1 and "1 failed" in run.stdout, run.stdout[-600:]
    replayed = subprocess.run(
        [sys.executable, "-m", "maskcheck", "replay", str(bundle)], cwd=tmp_path, capture_output=True, text=True
    )
    assert replayed.returncode == 1 and "collator/boundary_labels: FAIL" in replayed.stdout


def test_a_collator_that_raises_fails_on_the_fewest_examples_that_make_it_raise() -> None:
    def collate(features):  # type: ignore[no-untyped-def]
        if any(len(f["input_ids"]) > 4 for f in features):
            raise ValueError("too long")
        return {"input_ids": torch.tensor([f["input_ids"] + [0] * (4 - len(f["input_ids"])) for f in features])}

    check = failing(audit_collator(collate, "causal-lm", pad_id=0, eos_id=2))["attention_mask"]
    assert check.message == "the collator raised ValueError: too long"
    assert [len(e["input_ids"]) for e in check.case["examples"]] == [5]


def test_a_collator_report_follows_the_report_schema() -> None:
    import jsonschema

    from maskcheck.harness.report.render import report_schema

    result = audit_collator("collator:examples.collators:pad_is_eos")
    jsonschema.validate(result.to_dict(), report_schema())


def test_bad_collator_specs_are_one_line_errors() -> None:
    with pytest.raises(CollatorError, match="has no callable 'nothing'"):
        audit_collator("collator:examples.collators:nothing")
    with pytest.raises(CollatorError, match="unknown collator task 'masked-lm'"):
        audit_collator("collator:examples.collators:flattening", "masked-lm")


def test_the_cli_audits_a_collator() -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "maskcheck",
            "audit",
            "collator:examples.collators:pad_is_eos",
            "--task",
            "causal-lm",
            "-q",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1 and "collator  FAIL" in run.stdout and "never learns to stop" in run.stdout


# -- gradient accumulation -------------------------------------------------------------------------


def per_batch_mean(model, micro_batches):  # type: ignore[no-untyped-def]
    """The classic loop: each micro-batch's mean loss divided by the number of micro-batches."""
    for batch in micro_batches:
        (model(**batch).loss / len(micro_batches)).backward()


def divided_by_the_total(model, micro_batches):  # type: ignore[no-untyped-def]
    """transformers' fix: each micro-batch's summed loss divided by the whole batch's valid targets."""
    total = sum(int((b["labels"][:, 1:] != -100).sum()) for b in micro_batches)
    for batch in micro_batches:
        model(**batch, num_items_in_batch=torch.tensor(total)).loss.backward()


def summed_by_hand(model, micro_batches):  # type: ignore[no-untyped-def]
    total = sum(int((b["labels"][:, 1:] != -100).sum()) for b in micro_batches)
    for batch in micro_batches:
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"][:, 1:].reshape(-1), reduction="sum").div(
            total
        ).backward()


@pytest.mark.parametrize("loop", [divided_by_the_total, summed_by_hand])
def test_normalising_by_the_total_number_of_targets_passes(loop) -> None:  # type: ignore[no-untyped-def]
    result = check_gradient_accumulation(tiny_model("llama"), loop)
    assert result.status == "pass" and result.relative_error <= result.threshold
    assert len(set(result.valid_targets)) == 3  # micro-batches of unequal size, or the bug could not show


def test_averaging_per_batch_means_fails_with_the_counts_and_the_fix() -> None:
    model = tiny_model("llama")
    result = check_gradient_accumulation(model, per_batch_mean)
    assert result.status == "fail" and result.relative_error > 100 * result.threshold
    assert "the micro-batches hold 3, 12, 20 valid targets" in result.message and "num_items_in_batch" in result.message
    with pytest.raises(AssertionError, match="accumulated gradients differ"):
        assert_gradient_accumulation(model, per_batch_mean)
    assert not model.training and all(p.grad is None for p in model.parameters())  # left as found
