"""Declared attention patterns beyond causal and sliding windows: chunked attention (Llama
4's) and prefix LMs, each verified at its real width, or said not to be."""

from __future__ import annotations

import pytest
import torch

from maskcheck import Capabilities, LayerAttention, audit
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.hf_probes import declared_attention, declared_layers
from maskcheck.harness.adapters.module import ModuleAdapter
from maskcheck.harness.adapters.prefix import as_model_input, default_prefix
from maskcheck.harness.adapters.specs import SpecError, adapter_for
from maskcheck.harness.report.render import suite_reason
from maskcheck.reference_models.chunked_hf import CHUNK, CHUNKED_THEN_FULL, EVERY_LAYER_CHUNKED, llama4
from maskcheck.reference_models.prefix_lm import PrefixLM


def statuses(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {f"{s.name}/{c.name}": c.status for s in result.suites for c in s.checks}


def checks_of(result, suite: str) -> dict:  # type: ignore[no-untyped-def]
    return {c.name: c for c in result.suite(suite).checks}


# -- chunked attention ------------------------------------------------------------------------


def test_llama4_declares_its_chunk_per_layer() -> None:
    every = llama4(EVERY_LAYER_CHUNKED).config
    mixed = llama4(CHUNKED_THEN_FULL).config
    assert declared_layers(every) == (LayerAttention("chunked", CHUNK),) * 2
    assert declared_attention(every, "decoder") == ("chunked", CHUNK)
    assert declared_layers(mixed) == (LayerAttention("chunked", CHUNK), LayerAttention("full"))
    assert declared_attention(mixed, "decoder") == ("causal", None)  # one full layer reaches back to the start


def test_a_chunk_is_not_a_window() -> None:
    """The first query of a chunk reads only itself, however long the row before it."""
    chunk, window = LayerAttention("chunked", 4).allowed(8), LayerAttention("sliding", 4).allowed(8)
    assert chunk[4].tolist() == [False] * 4 + [True] + [False] * 3
    assert window[4].tolist() == [False, True, True, True, True, False, False, False]
    with pytest.raises(ValueError, match="chunked layer takes a width"):
        LayerAttention("chunked")


@pytest.mark.parametrize("layers", [EVERY_LAYER_CHUNKED, CHUNKED_THEN_FULL], ids=["every-layer", "then-full"])
def test_llama4_with_small_chunks_passes_with_its_chunk_named(layers: tuple[str, ...]) -> None:
    result = audit(HFAdapter(llama4(layers)), ["causal", "padding", "kv_cache"], paths=())
    assert {s.name: s.status for s in result.suites} == {"causal": "pass", "padding": "pass", "kv_cache": "pass"}
    causal = checks_of(result, "causal")
    assert causal["layer_windows"].verified.startswith(f"per layer: chunk C={CHUNK}")
    line = suite_reason("pass", list(causal.values()))
    if layers == EVERY_LAYER_CHUNKED:
        assert f"verified chunked attention C={CHUNK} in every layer" in line
    else:
        assert causal["declared_pattern"].verified == "causal" and "full attention" in line


def test_a_chunk_no_case_sees_end_is_not_verified_and_the_suite_does_not_pass() -> None:
    """Llama 4's default chunk (8192) is past the ci profile's cases: one line says so, in
    the check that would verify it, and causal is not_run rather than PASS."""
    every = audit(HFAdapter(llama4(EVERY_LAYER_CHUNKED, chunk=8192)), ["causal"], profile="ci", paths=())
    mixed = audit(HFAdapter(llama4(CHUNKED_THEN_FULL, chunk=8192)), ["causal"], profile="ci", paths=())
    for result, check in ((every, "declared_pattern"), (mixed, "layer_windows")):
        found = checks_of(result, "causal")[check]
        assert found.status == "not_run" and found.message.startswith("chunk C=8192 not verified"), found.message
        assert result.suite("causal").status == "not_run"


def test_a_module_mixing_chunked_and_full_layers_says_what_it_cannot_verify() -> None:
    def forward(input_ids: torch.Tensor) -> torch.Tensor:  # causal, by construction: position t reads ids <= t
        return torch.nn.functional.one_hot(input_ids.cumsum(-1) % 16, 16).float()

    capabilities = Capabilities(
        family="decoder", vocab_size=16, layers=[("chunked", 4), ("full", None)], takes_attention_mask=False
    )
    result = audit(ModuleAdapter(forward, capabilities), ["causal"], paths=())
    check = checks_of(result, "causal")["layer_windows"]
    assert check.status == "not_run"
    assert check.message == (
        "chunk C=4 not verified: the model mixes it with full attention layers, and ModuleAdapter cannot show its "
        "layers' attention to check each layer"
    )


def test_the_reference_chunked_decoder_evicts_and_decodes_past_its_chunks() -> None:
    checks = checks_of(audit("ref:tiny-decoder-chunked", ["serving"]), "serving")
    assert checks["window_eviction"].status == "pass", checks["window_eviction"].message


# -- prefix LMs ------------------------------------------------------------------------------


def test_a_prefix_lm_module_is_audited_without_a_false_failure() -> None:
    result = audit(PrefixLM(), ["causal", "padding", "kv_cache", "serving"])
    bad = {name: status for name, status in statuses(result).items() if status in ("fail", "error", "not_run")}
    assert not bad, bad
    assert checks_of(result, "causal")["declared_pattern"].verified.startswith("prefix LM")
    assert "a prefix LM's prefix reads what follows it" in result.environment["batching"]


def test_the_default_prefix_follows_each_sequences_real_tokens() -> None:
    real = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]])  # left-padded, right-padded
    assert default_prefix(real).long().tolist() == [[0, 0, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0]]
    segments = torch.tensor([[0, 0, 1, 1, 1, 1]])  # two packed sequences: each has its own prefix
    assert default_prefix(torch.ones(1, 6), segments).long().tolist() == [[1, 1, 1, 1, 1, 0]]


def test_a_prefix_goes_in_as_the_model_takes_it() -> None:
    prefix = torch.tensor([[1, 1, 0, 0]]).bool()
    assert as_model_input(prefix, "mask").tolist() == [[1, 1, 0, 0]]
    assert as_model_input(prefix, "token_type_ids").tolist() == [[0, 0, 1, 1]]  # PaliGemma: 0 = prefix
    assert as_model_input(prefix, "lengths").tolist() == [2]


def test_a_prefix_lm_without_its_prefix_keyword_is_one_line() -> None:
    model = PrefixLM()
    model.maskcheck_prefix_keyword = None
    with pytest.raises(SpecError, match="attention='prefix_lm' needs maskcheck_prefix_keyword"):
        adapter_for(model)
