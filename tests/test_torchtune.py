"""torchtune's TransformerDecoder as torchtune builds it (examples/third_party.py): its mask is
measured to be an attention matrix, its KV cache is driven as its generate() drives it, a
planted cache bug fails, and the model is left as the audit found it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from maskcheck import audit
from maskcheck.harness.adapters.specs import adapter_for
from maskcheck.reference_models.mutants import MUTANTS

pytestmark = pytest.mark.torchtune  # run in .venv-torchtune (.ci/run builds it: pyproject.toml's torchtune extra)
pytest.importorskip("torchtune")  # the torchtune extra installs it; without it this file cannot run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import third_party  # noqa: E402

EVERY_CHECK_RUNS = ("causal", "padding", "packing", "kv_cache")


def statuses(result, suite: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {check.name: check.status for check in result.suite(suite).checks}


def test_a_torchtune_decoder_is_audited_with_its_mask_matrix_and_kv_cache_and_left_as_found() -> None:
    model = third_party.torchtune_decoder()
    adapter = adapter_for(model)
    described = adapter.describe()
    matrix = "an attention matrix [B, T, T], True = may attend"
    assert described["mask"] == f"mask= ({matrix}, its name's convention, measured)"
    assert adapter.mask_finding is None and adapter.capabilities.unpadded_cache_reason is None

    result = audit(adapter, [*EVERY_CHECK_RUNS, "serving"], profile="ci")
    for suite in EVERY_CHECK_RUNS:  # every check ran, left-padded cached prompts included
        assert set(statuses(result, suite).values()) == {"pass"}, (suite, statuses(result, suite))
    serving = statuses(result, "serving")
    assert serving["reuse"] == "pass"
    assert "no rollback" in next(c.message for c in result.suite("serving").checks if c.name == "rollback")
    assert {status for name, status in serving.items() if name != "reuse"} == {"not_applicable"}

    # The host's model afterwards: no caches left set up, and its plain forward (no mask) is causal.
    assert not model.caches_are_setup()
    ids = torch.randint(1, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full, prefix = model(ids), model(ids[:, :3])
    torch.testing.assert_close(full[:, :3], prefix, atol=1e-5, rtol=1e-5)


def test_the_planted_torchtune_cache_bug_fails_kv_cache_and_nothing_else() -> None:
    mutant = MUTANTS["torchtune_cache_advances_one_slot"]
    result = audit(mutant.build(), ["causal", "padding", "kv_cache"], profile="ci")
    assert statuses(result, "kv_cache")[mutant.check] == "fail", result.suite("kv_cache")
    assert result.suite("causal").status == "pass" and result.suite("padding").status == "pass"
    clean = audit(mutant.clean(), ["kv_cache"], profile="ci")
    assert clean.suite("kv_cache").status == "pass", clean.suite("kv_cache")


def test_caches_the_model_came_with_are_set_up_again_empty() -> None:
    model = third_party.torchtune_decoder()
    model.setup_caches(batch_size=2, dtype=torch.float32, decoder_max_seq_len=32)
    result = audit(model, ["kv_cache"], profile="ci")
    assert result.suite("kv_cache").status == "pass", result.suite("kv_cache")
    caches = [m.kv_cache for m in model.modules() if getattr(m, "kv_cache", None) is not None]
    assert caches and all(c.k_cache.shape[0] == 2 and c.k_cache.shape[2] == 32 and c.size == 0 for c in caches)


def test_a_torchtune_lora_decoder_is_audited_with_its_adapter_active() -> None:
    from torchtune.models.llama3 import lora_llama3

    from maskcheck.reference_models.torchtune_decoders import TINY

    torch.manual_seed(0)
    model = lora_llama3(["q_proj", "v_proj"], **TINY, lora_rank=4, lora_alpha=8).eval()
    with torch.no_grad():  # LoRA's B starts at zero: give the adapter something to add
        for name, parameter in model.named_parameters():
            if "lora_b" in name:
                parameter.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    result = audit(model, ["causal", "padding", "kv_cache"], profile="ci")
    assert {s.name: s.status for s in result.suites} == {"causal": "pass", "padding": "pass", "kv_cache": "pass"}


def test_the_documented_torchtune_audit_exits_clean() -> None:
    """docs/checkpoints.md's command, which the docs test (in the default environment,
    without torchtune) cannot run."""
    import subprocess

    examples = Path(__file__).resolve().parent.parent / "examples"
    completed = subprocess.run(
        [sys.executable, "-m", "maskcheck", "audit", "module:third_party:torchtune_decoder", "--suites",
         "causal,padding,packing,kv_cache", "-q"],
        cwd=examples, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-2000:] + completed.stderr[-2000:]
