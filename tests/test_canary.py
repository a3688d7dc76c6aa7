"""The leak canary: every seeded pipeline bug fires it, no clean pipeline does (on the CI
seeds; the offline calibration over many seeds is scripts/canary_calibration.py)."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch

from maskcheck import CanaryFired, assert_no_leak
from maskcheck.harness.audits.canary import CanaryError, CanarySettings, canary_batches, decide, run_canary
from maskcheck.harness.audits.canary_trainers import ARGUMENTS, trainer_canary, twin_targets
from maskcheck.reference_models.pipelines import NEEDS, PIPELINES, decoder_step

#: every seeded bug fires within 100 steps, two windows of 50; TRL's wrapped packing, whose
#: learning rate decays to 0 over the steps, learns to copy a document within 200
CI = CanarySettings(steps=100)
#: what the canary measures on the way, for the pipelines where it matters
NOTES = {
    "sft_padding_free": "attention sdpa: drawing the other documents of a row again moves one document's logits by 0 "
    "(isolated)",
    "sft_wrapped_packing": "the model is told of no document boundary inside a row",
}


def _pipeline(name: str):  # type: ignore[no-untyped-def]
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    return PIPELINES[name][0]()


#: the fixed data seeds each pipeline runs on in CI: the clean ones on two (TRL's trainers,
#: ten times a reference step's cost, on one), every leaking one on seed 0
SEEDS = [
    (name, seed)
    for name, (_, leaks) in sorted(PIPELINES.items())
    for seed in ((0,) if leaks or name in NEEDS else (0, 1))
]


@pytest.mark.parametrize(("name", "seed"), SEEDS)
def test_the_canary_fires_on_every_seeded_pipeline_bug_and_on_no_clean_pipeline(name: str, seed: int) -> None:
    """Through the pytest entry point, assert_no_leak: it raises with the verdict of a leak."""
    pipeline, canary = _pipeline(name)
    if not PIPELINES[name][1]:
        result = assert_no_leak(pipeline, canary, CI, seed=seed)
        assert result.status == "pass"
        assert NOTES.get(name, "") in " ".join(result.notes), result.notes
        return
    with pytest.raises(CanaryFired, match=f"the {canary} canary fired at step") as fired:
        assert_no_leak(pipeline, canary, CI, seed=seed)
    result = fired.value.result
    assert result.status == "fail" and "Localise it with" in result.message, result.message
    assert NOTES.get(name, "") in " ".join(result.notes), result.notes


def test_a_loss_below_the_bound_that_the_reference_does_not_share_is_a_normaliser_error() -> None:
    """A step that halves its reported loss: the pipeline's number goes below log 16, the
    cross-entropy maskcheck computes from the same logits does not: warn, not a leak."""
    honest = decoder_step(_fresh_reference())

    def halved(batch):  # type: ignore[no-untyped-def]
        loss, logits = honest(batch)
        return loss / 2, logits

    result = run_canary(halved, "uniform", CI)
    assert result.status == "warn" and "normalised or computed wrongly" in result.message, result.message


def _fresh_reference() -> torch.nn.Module:
    from maskcheck.reference_models.mutants import build_clean

    torch.manual_seed(0)
    return build_clean("causal_sees_next_token")


def test_the_step_that_scores_its_inputs_is_told_from_a_mask_that_reads_ahead() -> None:
    scores_inputs = run_canary(PIPELINES["step_scores_inputs"][0]()[0], "uniform", CI)
    assert "labels not shifted" in scores_inputs.message and "loss_masking" in scores_inputs.message
    reads_ahead = run_canary(PIPELINES["causal_off_by_one"][0]()[0], "uniform", CI)
    assert "against the next tokens agrees" in reads_ahead.message and "causal" in reads_ahead.message


def test_the_test_fires_below_the_bound_only_beyond_its_margin() -> None:
    settings = CanarySettings(window=50, alpha=1e-3)
    bound = math.log(16)
    generator = torch.Generator().manual_seed(0)
    noise = (torch.randn(300, generator=generator) * 0.05).tolist()
    at_bound = [bound + abs(n) for n in noise]  # a converged clean pipeline: never below in expectation
    assert decide(at_bound, bound, settings)[0] is None
    just_below = [bound - 0.001 + n for n in noise]  # within the noise: not significant
    assert decide(just_below, bound, settings)[0] is None
    leaking = [bound - 0.1 + n for n in noise]
    fired, below, margin = decide(leaking, bound, settings)
    assert fired == 49 and below > margin > 0


def test_canary_data_is_what_each_canary_promises() -> None:
    settings = CanarySettings(steps=2, batch=4, length=8)
    uniform, documents, rows = (
        next(canary_batches(c, settings, 0)) for c in ("uniform", "twin_documents", "twin_rows")
    )
    assert uniform["input_ids"].min() >= 3 and uniform["input_ids"].max() < 3 + 16
    assert torch.equal(documents["input_ids"][:, :4], documents["input_ids"][:, 4:])
    assert documents["position_ids"][0].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert torch.equal(rows["input_ids"][0], rows["input_ids"][1]) and not torch.equal(
        rows["input_ids"][0], rows["input_ids"][2]
    )
    with pytest.raises(ValueError, match="unknown canary"):
        next(canary_batches("nope", settings, 0))


def test_a_step_that_raises_or_returns_no_loss_is_one_line() -> None:
    with pytest.raises(CanaryError, match="the training step raised at step 0: RuntimeError: boom"):
        run_canary(lambda batch: (_ for _ in ()).throw(RuntimeError("boom")), "uniform", CI)
    with pytest.raises(CanaryError, match="returned str, not a loss"):
        run_canary(lambda batch: "loss", "uniform", CI)


def _trainer(model: torch.nn.Module, tmp_path, collator=None, **settings) -> object:  # type: ignore[no-untyped-def]
    from transformers import Trainer, TrainingArguments, default_data_collator

    arguments = TrainingArguments(
        output_dir=str(tmp_path),
        **{"learning_rate": 3e-3, **settings},
        use_cpu=True,
        disable_tqdm=True,
        report_to=[],
        seed=0,
    )
    return Trainer(model=model, args=arguments, data_collator=collator or default_data_collator)


def inputs_one_token_ahead(examples):  # type: ignore[no-untyped-def]
    """A collator bug: the input ids run one token ahead of the labels, so the model, which
    shifts the labels, reads each target at the position that predicts it."""
    from transformers import default_data_collator

    batch = default_data_collator(examples)
    batch["input_ids"] = batch["input_ids"].roll(-1, dims=1)
    return batch


def test_a_transformers_trainer_runs_as_configured_and_its_logged_loss_is_judged(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from maskcheck.reference_models.hf_tiny import tiny_model

    clean = trainer_canary(_trainer(tiny_model("llama").train(), tmp_path / "a"), settings=CI)
    assert clean.status == "pass" and len(clean.losses) == len(clean.references) == CI.steps, clean.message
    leaking = trainer_canary(_trainer(tiny_model("llama").train(), tmp_path / "b", inputs_one_token_ahead), settings=CI)
    assert leaking.status == "fail" and "against the next tokens agrees" in leaking.message, leaking.message
    with pytest.raises(CanaryError, match="shuffles"):
        trainer_canary(_trainer(tiny_model("llama"), tmp_path / "c"), "twin_rows", CI)


def test_the_trainer_normalises_a_gpt2_loss_by_the_targets_before_the_shift(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """transformers 5.24's Trainer counts a causal LM's targets over labels[..., 1:] only when
    the class's name maps to ForCausalLMLoss; GPT2LMHeadModel's does not, so each row's first
    label is counted too and the logged loss is (T - 1) / T of the model's own (2.69 where the
    bound is 2.77). The canary reads it as the pipeline's number, not a leak: the cross-entropy
    of the same logits stays at the bound (docs/canary.md has the plain reproduction)."""
    from maskcheck.reference_models.hf_tiny import tiny_model

    result = trainer_canary(_trainer(tiny_model("gpt2").train(), tmp_path), settings=CI)
    assert result.status == "warn" and "normalised or computed wrongly" in result.message, result.message
    ratio = sum(result.losses[-50:]) / sum(result.references[-50:])
    assert ratio == pytest.approx(31 / 32, abs=1e-3)


def test_the_cli_runs_a_pipeline_and_exits_by_its_verdict(tmp_path) -> None:  # type: ignore[no-untyped-def]
    def canary(*argv: str) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
        return subprocess.run(
            [sys.executable, "-m", "maskcheck", "canary", *argv], capture_output=True, text=True, timeout=300
        )

    leaking = [f"pipeline:{name}" for name, (_, leaks) in PIPELINES.items() if leaks and name not in NEEDS]
    leaking += [f"pipeline:{name}" for name in NEEDS if PIPELINES[name][1] and importlib.util.find_spec(NEEDS[name])]
    fired = canary(*leaking, "--steps", "100", "--report", str(tmp_path))
    assert fired.returncode == 1, fired.stdout + fired.stderr
    for spec in leaking:  # every seeded pipeline bug fires its canary in the CLI too
        assert re.search(rf"^{spec}  \w+ +FAIL +the \w+ canary fired at step \d+", fired.stdout, re.M), fired.stdout
    assert len(json.loads((tmp_path / "canary.json").read_text())) == len(leaking)
    assert (tmp_path / "canary.png").is_file()
    unknown = canary("pipeline:nope")
    assert unknown.returncode == 2 and unknown.stderr.strip().startswith("maskcheck: error: unknown pipeline 'nope'")
    assert "Traceback" not in unknown.stderr


def test_twin_targets_are_the_second_copy_chosen_from_what_precedes_it() -> None:
    document = list(range(3, 11))  # 8 ids
    ids = torch.tensor([[*document, *document, 20, 21]])
    labels = ids.clone()
    labels[0, 12] = -100
    twins = twin_targets(ids, labels, context=3)
    # the copy from its 4th id (12 is not scored), and the id after it: what precedes it repeats,
    # so a copying model would expect the copy to go on (the selection cannot know it ends)
    assert twins[0].nonzero().flatten().tolist() == [11, 13, 14, 15, 16]
    changed = ids.clone()
    changed[0, 11] = 30  # a target's own value does not decide whether it is scored
    assert twin_targets(changed, labels, context=3)[0, 11]


def test_the_isolation_of_packed_documents_is_measured_in_the_forward_the_trainer_runs() -> None:
    """Padding-free inputs (position ids restarting, no mask): transformers isolates the
    documents only where no cache is made, so a forward leaving use_cache at its default
    lets them read each other (docs/canary.md)."""
    from maskcheck.harness.audits.canary_trainers import document_isolation
    from maskcheck.reference_models.pipelines import _tiny_llama

    model = _tiny_llama().train()
    ids = torch.randint(3, 19, (1, 32), generator=torch.Generator().manual_seed(0))
    padding_free = {"input_ids": ids, "labels": ids, "position_ids": torch.arange(8).repeat(4)[None]}
    isolated = document_isolation(model, {**padding_free, "use_cache": False}, CI)
    assert "4 documents in the first batch, attention sdpa" in isolated and "by 0 (isolated)" in isolated, isolated
    leaking = document_isolation(model, padding_free, CI)
    assert "(NOT isolated)" in leaking and model.training, leaking
    assert document_isolation(model, {"input_ids": ids, "position_ids": torch.arange(32)[None]}, CI) == ""


def test_a_trainer_that_packs_no_documents_cannot_run_the_twin_canary_and_its_arguments_are_restored() -> None:
    trainer, _ = PIPELINES["clean_trainer"][0]()
    before = {name: getattr(trainer.args, name) for name in ARGUMENTS}
    with pytest.raises(CanaryError, match="does not pack documents together"):
        trainer_canary(trainer, "twin_documents", CI)
    assert {name: getattr(trainer.args, name) for name in ARGUMENTS} == before
    assert trainer._train_batch_size == trainer.args.train_batch_size and "compute_loss" not in vars(trainer)


def test_a_pipeline_that_does_not_learn_is_inconclusive_not_a_pass() -> None:
    result = run_canary(lambda batch: torch.tensor(math.log(40.0)), "uniform", CI)
    assert result.status == "warn" and result.message.startswith("inconclusive"), result.message
    with pytest.raises(CanaryFired, match="inconclusive"):
        assert_no_leak(lambda batch: torch.tensor(math.log(40.0)), settings=CI)


def decoder_inputs_are_the_labels(examples):  # type: ignore[no-untyped-def]
    """A seq2seq collator bug: the decoder reads the labels themselves, not shifted right."""
    from transformers import default_data_collator

    batch = default_data_collator(examples)
    batch["decoder_input_ids"] = batch["labels"].clone()
    return batch


def test_an_encoder_decoder_trainer_reads_its_targets_from_an_independent_source(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A T5 under a Trainer: the canary's sources are drawn apart from its targets (a source
    equal to the target would let any encoder-decoder copy it), and the reference scores
    logits[t] against labels[t], the encoder-decoder's convention. The tiny T5 learns the
    ids' frequencies more slowly than the decoders: 200 steps at 1e-2 (at 3e-3, or in 100
    steps, it ends 0.4-0.6 nats above the bound and the canary says inconclusive)."""
    from maskcheck.reference_models.hf_tiny import tiny_model

    fast = {"learning_rate": 1e-2, "lr_scheduler_type": "constant"}
    clean = trainer_canary(
        _trainer(tiny_model("t5").train(), tmp_path / "a", **fast), settings=CanarySettings(steps=200)
    )
    assert clean.status == "pass" and len(clean.references) == 200 and not clean.unshifted, clean.message
    assert clean.references[-1] == pytest.approx(clean.losses[-1], abs=1e-4)  # the model's own loss, recomputed
    leaking = trainer_canary(
        _trainer(tiny_model("t5").train(), tmp_path / "b", decoder_inputs_are_the_labels, **fast), settings=CI
    )
    assert leaking.status == "fail" and "against the next tokens agrees" in leaking.message, leaking.message
    with pytest.raises(CanaryError, match="packs no documents"):
        trainer_canary(_trainer(tiny_model("t5").train(), tmp_path / "c"), "twin_documents", CI)


def test_a_hand_written_loop_step_takes_its_model_and_the_batch() -> None:
    """``step(model, batch) -> loss`` with its model as ``(step, model)``, the shape of a
    hand-written loop; a step scoring each position's own token fires."""
    import torch.nn.functional as F

    def step(model, batch, shift=True):  # type: ignore[no-untyped-def]
        logits = model(batch["input_ids"], batch["attention_mask"]).logits
        scores, targets = (logits[:, :-1], batch["labels"][:, 1:]) if shift else (logits, batch["labels"])
        loss = F.cross_entropy(scores.flatten(0, 1), targets.flatten())
        model.optimizer.zero_grad()
        loss.backward()
        model.optimizer.step()
        return loss.detach(), logits.detach()

    def trained(model):  # type: ignore[no-untyped-def]
        model.optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
        return model

    assert assert_no_leak((step, trained(_fresh_reference())), settings=CI).status == "pass"
    with pytest.raises(CanaryFired, match="labels not shifted"):
        assert_no_leak((lambda m, b: step(m, b, shift=False), trained(_fresh_reference())), settings=CI)


def test_building_the_trainer_pipelines_leaves_nothing_in_the_temporary_directory(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A trainer's arguments need an output_dir; the pipelines' own scratch directories go
    with the process that made them (in a process of its own, so its exit is the one seen)."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    names = ["clean_trainer"] + [name for name in NEEDS if importlib.util.find_spec(NEEDS[name])]
    code = (
        "import tempfile; from maskcheck.reference_models.pipelines import PIPELINES\n"
        f"for name in {names!r}: PIPELINES[name][0]()\n"
        "print(tempfile.gettempdir())"
    )
    env = {**os.environ, "TMPDIR": str(scratch)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == str(scratch), done.stdout
    assert sorted(p.name for p in scratch.iterdir() if p.name.startswith("maskcheck-")) == []
