"""The architecture sweep's fixes and its CI subset: shrunk random-init models of the
installed transformers, audited in-process, against the verdicts docs/architectures.md records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from maskcheck import audit
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.engine.registry import suite_names
from maskcheck.reference_models.hf_bugs import logits_shifted_with_cache
from maskcheck.reference_models.hf_tiny import shrunk_model

pytestmark = pytest.mark.call_paths  # every call path (conftest.py)

SWEEP_SUITES = suite_names(lambda suite: suite.in_sweep)


def test_a_shrunk_config_takes_the_overrides_of_its_head() -> None:
    """Reformer's causal-LM head refuses a config without is_decoder, its masked-LM head one
    with it: each task's shrunk model builds and runs."""
    for task, decoder in (("causal-lm", True), ("masked-lm", False)):
        model = shrunk_model("reformer", task)
        assert model.config.is_decoder is decoder
        with torch.no_grad():
            assert model(input_ids=torch.tensor([[3, 4, 5, 127]])).logits.shape == (1, 4, 128)


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
    checks = {
        c.name: c for c in audit(HFAdapter(shrunk_model("rwkv", "causal-lm")), ["padding"]).suite("padding").checks
    }
    assert checks["pad_ids"].status == "fail"
    for name in ("padded_vs_unpadded", "extra_padding"):
        assert checks[name].status == "fail" and "the padding mask is not applied" in checks[name].message
        assert "not a mask leak" not in checks[name].message


def test_suites_that_do_not_measure_pad_ids_check_the_mask_before_blaming_positions() -> None:
    """xLSTM takes no position ids and its forward swallows attention_mask: cached decoding of
    a left-padded batch and a padded loss fail because the padding is read, which kv_cache
    measures on the failing batch and loss_masking takes from padded_inputs. BART's decoder
    applies its mask: there the positional explanation stays."""
    result = audit(HFAdapter(shrunk_model("xlstm", "causal-lm")), ["kv_cache", "loss_masking"], profile="dev")
    greedy = next(c for c in result.suite("kv_cache").checks if c.name == "greedy_generation")
    extra = next(c for c in result.suite("loss_masking").checks if c.name == "extra_padding")
    for check in (greedy, extra):
        assert check.status == "fail" and check.message.endswith("the padding mask is not applied"), check.message
    bart = kv_checks(shrunk_model("bart", "causal-lm"))["greedy_generation"]
    assert bart.status == "fail" and bart.message.endswith(
        "(derive positions from attention_mask, or accept position_ids)"
    ), bart.message


def kv_checks(model) -> dict:  # type: ignore[no-untyped-def]
    return {c.name: c for c in audit(HFAdapter(model), ["kv_cache"], profile="dev").suite("kv_cache").checks}


def test_generate_is_compared_with_itself_where_it_prepares_other_inputs_than_the_prompt() -> None:
    """XLM appends a mask token to every forward's input and XLNet a dummy token: the cache
    checks cannot follow them, so generate() with its cache is compared with generate()
    without. XLNet's agree; XLM's do not: its default config attends both ways, so keys and
    values cached before later tokens existed are stale (docs/suites.md)."""
    xlnet = kv_checks(shrunk_model("xlnet", "causal-lm"))
    assert (
        xlnet["incremental"].status == "not_applicable"
        and "does not feed this model its prompt" in xlnet["incremental"].message
    )
    assert xlnet["generate_use_cache"].status == "pass", xlnet["generate_use_cache"].message
    xlm = kv_checks(shrunk_model("xlm", "causal-lm"))["generate_use_cache"]
    assert (
        xlm.status == "fail"
        and "generate() with its cache (use_cache=True) differs from generate() without one" in xlm.message
    )


def test_generate_use_cache_fails_a_seeded_cache_only_difference() -> None:
    """OpenAI-GPT's generate() feeds the whole sequence at every step: with and without a
    cache it must agree (it does); a forward that shifts the logits whenever a cache is
    asked for is caught."""
    model = shrunk_model("openai-gpt", "causal-lm")
    assert kv_checks(model)["generate_use_cache"].status == "pass"
    logits_shifted_with_cache(model)
    seeded = kv_checks(model)["generate_use_cache"]
    assert seeded.status == "fail" and "use_cache=False" in seeded.message


# -- the CI subset of the sweep: one process per xdist worker, no subprocess per type ------------

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "architectures.jsonl"
#: every family: absolute, rotary, ALiBi positions; sliding and mixed windows; chunks; MoE;
#: state-space and hybrid (Mamba, Jamba, Bamba, RWKV); multi-head latent attention
#: (DeepSeek-V3); encoders and encoder-decoder decoders behind a causal-LM head
# Types whose audit takes over 15 s on one core are marked slow (make test-slow runs them).
SUBSET = [
    ("gpt2", "causal-lm"),
    ("llama", "causal-lm"),
    ("mistral", "causal-lm"),
    ("qwen2", "causal-lm"),
    ("gemma2", "causal-lm"),
    ("gemma3_text", "causal-lm"),
    ("cohere2", "causal-lm"),
    ("starcoder2", "causal-lm"),
    ("mixtral", "causal-lm"),
    ("qwen2_moe", "causal-lm"),
    ("olmoe", "causal-lm"),
    ("mpt", "causal-lm"),
    ("bloom", "causal-lm"),
    ("falcon", "causal-lm"),
    ("gpt_neox", "causal-lm"),
    ("opt", "causal-lm"),
    ("phi", "causal-lm"),
    pytest.param("mamba", "causal-lm", marks=pytest.mark.slow),
    pytest.param("jamba", "causal-lm", marks=pytest.mark.slow),
    pytest.param("rwkv", "causal-lm", marks=pytest.mark.slow),
    pytest.param("bert", "causal-lm", marks=pytest.mark.slow),
    pytest.param("roberta", "causal-lm", marks=pytest.mark.slow),
    pytest.param("bart", "causal-lm", marks=pytest.mark.slow),
    pytest.param("xglm", "causal-lm", marks=pytest.mark.slow),
    ("biogpt", "causal-lm"),
    pytest.param("bamba", "causal-lm", marks=pytest.mark.slow),
    ("deepseek_v3", "causal-lm"),
    ("llama4_text", "causal-lm"),  # a chunked layer, then a full one
    # classifier heads: the pad-id condition (decoders), the first slot (encoders), and the
    # confirmed FAILs of the sweep (ConvBERT's convolution and FNet's Fourier mixing read padded slots)
    ("gpt2", "sequence-classification"),
    ("llama", "sequence-classification"),
    ("bert", "sequence-classification"),
    ("convbert", "sequence-classification"),
    ("fnet", "sequence-classification"),
    ("bert", "token-classification"),
    ("gpt2", "token-classification"),
]


def recorded(model_type: str, task: str) -> dict:
    records = [json.loads(line) for line in RESULTS.read_text().splitlines()]
    matches = [r for r in records if (r["type"], r["task"], r["implementation"]) == (model_type, task, "default")]
    assert matches, (
        f"{model_type} ({task}) is not in {RESULTS.name}: run scripts/sweep/architecture_sweep.py --types {model_type}"
    )
    return matches[-1]


@pytest.mark.parametrize("model_type, task", SUBSET)
def test_the_sweep_verdicts_hold_in_ci(model_type: str, task: str) -> None:
    import transformers

    record = recorded(model_type, task)
    assert record["transformers"] == transformers.__version__, (
        f"{RESULTS.name} was recorded with transformers {record['transformers']}, the tests run {transformers.__version__}: "
        "the set-up pins the version the table was made with"
    )
    assert record.get("built"), record.get("error")
    model = shrunk_model(model_type, task, level=record.get("shrink", "full"))
    result = audit(HFAdapter(model, f"hf-type:{model_type}", task=task), list(SWEEP_SUITES), profile="ci")
    verdicts = {suite.name: suite.status for suite in result.suites}
    assert verdicts == {name: data["status"] for name, data in record["suites"].items() if name in SWEEP_SUITES}, {
        s.name: s.worst_check().message[:200] for s in result.suites if s.status != record["suites"][s.name]["status"]
    }


@pytest.mark.parametrize("model_type", ["ctrl", "xlnet"])
def test_the_gradient_checks_measure_models_that_embed_in_place_or_sequence_first(model_type: str) -> None:
    """CTRL multiplies its token embeddings in place, XLNet embeds its ids transposed
    ([T, B]): the gradient checks hand the model a copy of the leaf they differentiate and
    read the layout from the ids the embedding was given, so they measure both instead of
    erring, and agree with the forward checks (XLNet's causal LM sees the future)."""
    result = audit(HFAdapter(shrunk_model(model_type, "causal-lm")), ["causal", "padding"], profile="dev")
    checks = {c.name: c for suite in result.suites for c in suite.checks}
    assert checks["padded_gradients"].status == "pass", checks["padded_gradients"].message
    assert checks["future_gradients"].status == checks["future_tokens"].status, checks["future_gradients"].message
    assert checks["future_tokens"].status == ("fail" if model_type == "xlnet" else "pass")
