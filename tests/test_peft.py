"""PEFT models as users fine-tune them: a LoRA PeftModel (any task type, merged or not) is
audited with its base model's coverage, its adapter's weights active; an adapter its base
model does not hold (prompt learning) is refused in one line."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from maskcheck import audit
from maskcheck.harness.adapters.base import Batch
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.cli import main
from maskcheck.harness.report.render import render_table
from maskcheck.reference_models.hf_tiny import tiny_model
from maskcheck.reference_models.mutants import MUTANTS

peft = pytest.importorskip("peft")  # the dev extra installs it; maskcheck itself never imports it

#: several modules, attention and MLP, with random B matrices: the adapter changes every logit
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "down_proj"]


def lora(model, task_type: str | None = "CAUSAL_LM"):  # type: ignore[no-untyped-def]
    torch.manual_seed(1)
    config = peft.LoraConfig(r=4, target_modules=TARGETS, init_lora_weights=False, task_type=task_type)
    return peft.get_peft_model(model, config)


def statuses(result) -> dict:  # type: ignore[no-untyped-def, type-arg]
    return {(s.name, c.name): c.status for s in result.suites for c in s.checks}


SUITES = ["causal", "padding", "loss_masking", "kv_cache", "serving"]


@pytest.fixture(scope="module")
def base_statuses() -> dict:  # type: ignore[type-arg]
    return statuses(audit(tiny_model("llama"), SUITES, paths=("canonical",)))


@pytest.mark.parametrize(
    "wrap",
    [
        pytest.param(lambda m: lora(m), id="lora-causal-lm"),
        pytest.param(lambda m: lora(m, task_type=None), id="lora-no-task-type"),
        pytest.param(lambda m: lora(m).merge_and_unload(), id="merged-and-unloaded"),
        pytest.param(lambda m: _merged_in_place(lora(m)), id="merged-in-place"),
    ],
)
def test_a_lora_model_is_audited_with_its_base_model_s_coverage(wrap, base_statuses) -> None:  # type: ignore[no-untyped-def]
    """Every check that runs on the plain Llama runs, and passes, on the LoRA model: before,
    a PeftModel was refused, and HFAdapter(peft_model) left kv_cache's checks n/a."""
    result = audit(wrap(tiny_model("llama")), SUITES, paths=("canonical",))
    assert statuses(result) == base_statuses, render_table(result, "lora", 0.0, verbose=True)
    assert {s.name: s.status for s in result.suites}["kv_cache"] == "pass"


def _merged_in_place(model):  # type: ignore[no-untyped-def]
    model.merge_adapter()
    return model


def test_the_adapter_is_active_in_what_is_audited_and_the_report_says_what_wraps_it() -> None:
    model = lora(tiny_model("llama"))
    adapter = HFAdapter(model)
    ids = torch.randint(1, 60, (2, 7), generator=torch.Generator().manual_seed(0))
    audited = adapter.logits(Batch(ids))
    with torch.inference_mode():
        users = model(input_ids=ids).logits
        with model.disable_adapter():
            without = model(input_ids=ids).logits
    torch.testing.assert_close(audited, users, rtol=0, atol=0)
    assert float((audited - without).abs().max()) > 1e-2  # the LoRA weights change the logits
    described = adapter.describe()["wrapper"]
    assert "LORA adapter 'default' on down_proj, gate_proj, k_proj, o_proj, q_proj, v_proj" in described
    table = render_table(audit(model, ["causal"], paths=("canonical",)), "lora", 0.0)
    assert "audited through its base model LlamaForCausalLM with the adapter active" in table.splitlines()[1]


def test_a_mask_bug_of_the_base_model_is_caught_under_its_lora_adapter() -> None:
    mutant = MUTANTS["hf_llama_ignores_padding"]
    padding = audit(lora(mutant.build()), ["padding"], paths=("canonical",)).suite("padding")
    failing = {c.name for c in padding.checks if c.status == "fail"}
    assert padding.status == "fail" and mutant.check in failing, padding


def prefix_tuned():  # type: ignore[no-untyped-def]
    config = peft.PrefixTuningConfig(num_virtual_tokens=3, task_type="CAUSAL_LM")
    return peft.get_peft_model(tiny_model("llama"), config)


def lora_factory():  # type: ignore[no-untyped-def]
    return lora(tiny_model("llama"))


def test_the_cli_audits_a_peft_factory_and_refuses_prompt_learning_in_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        assert main(["audit", "module:test_peft:lora_factory", "--suites", "causal", "-q"]) == 0
        assert main(["audit", "module:test_peft:prefix_tuned", "--suites", "causal", "-q"]) == 2
    finally:
        sys.path.remove(str(Path(__file__).parent))
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "a PREFIX_TUNING PeftModel prepends virtual tokens" in err[0], err
    assert "Traceback" not in "\n".join(err)
