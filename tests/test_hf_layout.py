"""norm_checkpoint's behaviour evidence for Hugging Face checkpoints: the shipped trained Llama
and Gemma (scripts/train_hf_checkpoint.py) under their own config pass, under each other's
class or a wrong rope base fail naming the variant their weights fit; random weights are
inconclusive; the report shows the variant table."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from maskcheck import audit
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.reference_models import SHIPPED_HF
from maskcheck.reference_models.hf_tiny import tiny_model


def behaviour(spec_or_model, **kwargs):  # type: ignore[no-untyped-def]
    suite = audit(spec_or_model, ["norm_checkpoint"], **kwargs).suite("norm_checkpoint")
    return next(c for c in suite.checks if c.name == "behaviour")


def declared_as(tmp_path: Path, name: str, **changes) -> Path:  # type: ignore[no-untyped-def]
    """A copy of a shipped checkpoint whose config.json a hand (or a conversion script) changed."""
    directory = tmp_path / f"{name}-edited"
    shutil.copytree(SHIPPED_HF[name], directory)
    config = json.loads((directory / "config.json").read_text())
    if "model_type" in changes:
        config.pop("hidden_act", None)  # the other class's own activation, as its config would default it
        config.pop("hidden_activation", None)
        config["architectures"] = [changes["class_name"]]
        changes.pop("class_name")
    config.update(changes)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def fitted_part(message: str) -> str:
    """The variants a failing message says the weights fit (before the declared layout)."""
    return message.split("not the declared layout")[0]


@pytest.mark.parametrize("name", sorted(SHIPPED_HF))
def test_a_trained_checkpoint_under_its_own_config_passes(name: str) -> None:
    suite = audit(f"hf:{SHIPPED_HF[name]}", ["norm_checkpoint"]).suite("norm_checkpoint")
    checks = {c.name: c for c in suite.checks}
    assert checks["load"].status == "pass"
    assert checks["behaviour"].status == "pass", checks["behaviour"].message
    assert checks["behaviour"].message.split("; ")[1].startswith("the weights fit the declared layout (class=")


def test_gemma_weights_declared_as_llama_fail_naming_gemma(tmp_path: Path) -> None:
    check = behaviour(f"hf:{declared_as(tmp_path, 'hf-gemma', model_type='llama', class_name='LlamaForCausalLM')}")
    assert check.status == "fail", check.message
    assert check.message.startswith("the weights fit class=GemmaForCausalLM")
    assert "not the declared layout class=LlamaForCausalLM" in check.message
    assert check.max_diff > check.threshold  # the loss gap, against a margin of a tenth of log V


def test_llama_weights_declared_as_gemma_fail_naming_llama(tmp_path: Path) -> None:
    check = behaviour(f"hf:{declared_as(tmp_path, 'hf-llama', model_type='gemma', class_name='GemmaForCausalLM')}")
    assert check.status == "fail", check.message
    assert "class=LlamaForCausalLM" in fitted_part(check.message)
    assert "not the declared layout class=GemmaForCausalLM" in check.message


def test_a_wrong_rope_base_fails_naming_the_trained_one(tmp_path: Path) -> None:
    check = behaviour(
        f"hf:{declared_as(tmp_path, 'hf-llama', rope_parameters={'rope_theta': 1_000_000.0, 'rope_type': 'default'})}"
    )
    assert check.status == "fail", check.message
    assert "rope_theta=10000" in fitted_part(check.message)
    assert "rope_theta=1000000.0" in check.message.split("not the declared layout")[1]


def test_random_weights_are_inconclusive_without_calling_anything_untrained() -> None:
    torch.manual_seed(0)
    check = behaviour(HFAdapter(tiny_model("llama")))
    assert check.status == "warn"
    assert check.message.startswith("inconclusive: no variant predicts the probe better than chance")
    assert "untrained" not in check.message


def test_the_report_shows_the_variant_table() -> None:
    from maskcheck.harness.report.render import render_markdown

    report = render_markdown(audit(f"hf:{SHIPPED_HF['hf-llama']}", ["norm_checkpoint"]).to_dict())
    assert "### norm_checkpoint / behaviour: PASS" in report
    assert "| variant | probe loss | temperature |" in report
    assert "| declared |" in report and "| class=GemmaForCausalLM |" in report and "| final_norm=False |" in report


def test_a_masked_lm_says_why_it_has_no_variants() -> None:
    check = behaviour(HFAdapter(tiny_model("bert"), task="masked-lm"))
    assert check.status == "not_applicable"
    assert (
        check.message
        == "the adapter cannot rebuild the weights under another variant (reference models and Hugging Face causal LMs can)"
    )


@pytest.mark.parametrize("model_type", ["llama", "gemma", "gpt2"])
def test_a_variant_is_built_without_drawing_its_random_init_and_computes_with_the_weights_given(
    model_type: str,
) -> None:
    """Every weight of a variant is loaded over its initialisation, so none is drawn (it cost
    more than the rest of a variant on a 124M model): the global generator does not move.
    Buffers the weights do not hold (rotary frequencies, Gemma's embedding scale) are still
    computed, so the same class rebuilt this way gives the model's logits exactly."""
    import copy

    from maskcheck.harness.adapters.hf_variants import _rebuild
    from maskcheck.reference_models.hf_tiny import shrunk_model

    model = shrunk_model(model_type, "causal-lm").eval()
    generator = torch.get_rng_state()
    rebuilt = _rebuild(type(model), copy.deepcopy(model.config), model.state_dict(), model)
    assert rebuilt is not None and torch.equal(torch.get_rng_state(), generator)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    with torch.inference_mode():
        assert torch.equal(rebuilt(input_ids=ids).logits, model(input_ids=ids).logits)
