"""Third-party Transformers as their authors wrote them (examples/third_party.py, the
recipes the README and docs/modules.md show): the mask keyword is found by name and its polarity measured;
clean models pass; a wrong polarity declared, or a mask dropped, fails; a module that
takes no mask still gets every check that needs none."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from maskcheck import audit
from maskcheck.harness.adapters.base import Batch, Capabilities
from maskcheck.harness.adapters.module import DeclarationError, ModuleAdapter
from maskcheck.harness.adapters.specs import adapter_for
from maskcheck.reference_models.scratch import ScratchDecoder

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import third_party  # noqa: E402

pytest.importorskip("x_transformers")  # the dev extra installs it; without it this file cannot run


@pytest.mark.parametrize(
    ("factory", "keyword", "meaning"),
    [
        (third_party.x_decoder, "mask", "True = real token"),
        (third_party.x_encoder, "mask", "True = real token"),
        (third_party.torch_encoder, "src_key_padding_mask", "True = padding"),
    ],
)
def test_the_mask_keyword_is_found_and_its_polarity_measured(factory, keyword: str, meaning: str) -> None:  # type: ignore[no-untyped-def]
    adapter = adapter_for(factory())
    assert adapter.describe()["mask"] == f"{keyword}= ({meaning}, its name's convention, measured)"
    assert adapter.mask_finding is None


@pytest.mark.parametrize("factory", [third_party.x_decoder, third_party.x_encoder, third_party.torch_encoder])
def test_clean_third_party_models_pass_the_mask_suites(factory) -> None:  # type: ignore[no-untyped-def]
    result = audit(factory(), ["causal", "padding"], profile="ci")
    assert {s.name: s.status for s in result.suites} == {"causal": "pass", "padding": "pass"}, result


def test_a_polarity_declared_the_wrong_way_fails_padding() -> None:
    model = third_party.torch_encoder()
    model.maskcheck_mask_convention = "keep"  # src_key_padding_mask is True at padding
    padding = audit(model, ["padding"]).suite("padding")
    assert padding.status == "fail", padding


def test_a_mask_keyword_the_forward_does_not_take_is_refused() -> None:
    model = third_party.torch_encoder()
    model.maskcheck_mask_keyword = "attention_mask"
    with pytest.raises(Exception, match="mask_keyword='attention_mask', but the forward takes no 'attention_mask'"):
        adapter_for(model)


def test_an_unmeasurable_polarity_asks_for_the_declaration_only_where_the_name_has_no_convention() -> None:
    def ignores_its_mask(input_ids, src_mask=None):  # type: ignore[no-untyped-def]
        return torch.zeros(*input_ids.shape, 8)

    with pytest.raises(DeclarationError, match="cannot tell the polarity of the forward's 'src_mask'.*declare"):
        ModuleAdapter(ignores_its_mask, Capabilities(family="decoder", vocab_size=8), mask_keyword="src_mask")


def ignores_mask(input_ids, mask=None):  # type: ignore[no-untyped-def]
    """A causal model (each position the mean of the embeddings so far) that never reads its mask."""
    table = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    embedded = table[input_ids]  # [B, T, V]
    return embedded.cumsum(1) / torch.arange(1, input_ids.shape[1] + 1)[None, :, None]


def key_padding_from_attention_mask(input_ids, attention_mask=None):  # type: ignore[no-untyped-def]
    """The same model, given PyTorch's key_padding_mask from attention_mask.bool() (True = ignore)."""
    table = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))
    ignored = torch.zeros_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    weights = (~ignored).float()[:, :, None]  # [B, T, 1]
    return (table[input_ids] * weights).cumsum(1) / weights.cumsum(1).clamp(min=1)


@pytest.mark.parametrize(
    ("forward", "measured"),
    [
        (ignores_mask, "a mask hiding the first half of the row changes nothing at its last position"),
        (key_padding_from_attention_mask, "the forward reads its mask inverted"),
    ],
)
def test_a_mask_its_forward_ignores_or_inverts_is_audited_and_fails_padding_with_the_measurement(
    forward, measured: str
) -> None:  # type: ignore[no-untyped-def]
    """A conventional name gets its convention; the measurement that contradicts it is the
    padding suite's reason, never a refusal to audit."""
    adapter = ModuleAdapter(forward, Capabilities(family="decoder", vocab_size=8, pad_token_id=0))
    assert adapter.mask_finding is not None and measured in adapter.mask_finding
    padding = audit(adapter, ["padding"]).suite("padding")
    assert padding.status == "fail" and padding.checks[0].name == "mask_read", padding
    assert measured in padding.worst_check().message  # type: ignore[union-attr]
    assert "which the forward does not keep" in adapter.describe()["mask"]


def test_a_module_without_a_mask_runs_every_check_that_needs_none() -> None:
    """A gpt-fast-style decoder: no mask parameter, a cache kept in the module. kv_cache and
    the loss's reference check run on unpadded rows; only what needs padding is n/a."""
    result = audit(ScratchDecoder(), ["causal", "padding", "kv_cache"], profile="ci")
    statuses = {s.name: s.status for s in result.suites}
    assert statuses == {"causal": "pass", "padding": "not_applicable", "kv_cache": "pass"}, result
    kv = {c.name: c.status for c in result.suite("kv_cache").checks}
    assert kv == {"incremental": "pass", "greedy_generation": "pass"}
    assert adapter_for(ScratchDecoder()).describe()["cache"] == "module"


def test_a_module_state_cache_forks_by_feeding_its_tokens_again() -> None:
    adapter = adapter_for(ScratchDecoder())
    ids = torch.randint(1, 64, (1, 5), generator=torch.Generator().manual_seed(0))
    _, state = adapter.prefill(Batch(ids[:, :3]))
    fork = adapter.fork(state)
    first, _ = adapter.step(state, ids[:, 3:4])
    other, _ = adapter.step(fork, ids[:, 4:5])  # the module holds the first branch now: the fork is fed again
    again, _ = adapter.step(adapter.fork(state), ids[:, 3:4])
    full = adapter.logits(Batch(ids))
    torch.testing.assert_close(first[0, -1], again[0, -1], atol=1e-5, rtol=0)
    torch.testing.assert_close(first[0, -1], full[0, 3], atol=1e-5, rtol=0)
    assert not torch.allclose(first, other)


# -- messages that name the cause ---------------------------------------------------------------


def test_a_nan_encoder_is_said_to_give_nan_not_to_behave_causally() -> None:
    """Before: NaN compares false, so a bidirectional encoder that returned NaN read as "no
    output is influenced by any later input: the model behaves causally"."""

    def nan_encoder(input_ids, attention_mask=None):  # type: ignore[no-untyped-def]
        return torch.full((*input_ids.shape, 8), float("nan"))

    adapter = ModuleAdapter(nan_encoder, Capabilities(family="encoder", vocab_size=8), mask_convention="keep")
    checks = {c.name: c for c in audit(adapter, ["causal"]).suite("causal").checks}
    pattern = checks["declared_pattern"]
    assert pattern.status == "fail" and "NaN/inf" in pattern.message and "causally" not in pattern.message
    decoder = ModuleAdapter(nan_encoder, Capabilities(family="decoder", vocab_size=8), mask_convention="keep")
    future = next(c for c in audit(decoder, ["causal"]).suite("causal").checks if c.name == "future_tokens")
    assert future.status == "fail" and "NaN/inf" in future.message and "so nothing could be compared" in future.message


def test_a_cache_bug_on_unpadded_rows_is_not_blamed_on_left_padding() -> None:
    """Before: greedy_generation appended "left padding shifts the positions" to a cache bug
    whose shrunk case had no padding at all."""
    from maskcheck.reference_models.mutants import build

    checks = {
        c.name: c for c in audit(build("module_state_cache_position_off_by_one"), ["kv_cache"]).suite("kv_cache").checks
    }
    greedy = checks["greedy_generation"]
    assert greedy.status == "fail" and "an unpadded batch" in greedy.message
    assert "left padding" not in greedy.message and greedy.caveat is None


def test_a_batch_without_other_rows_is_named_so() -> None:
    from maskcheck.suites.padding import _rows

    assert _rows(()) == "none (row 0 alone)" and _rows((2, 3)) == "rows of lengths [2, 3]"


def test_a_module_state_cache_bug_replays_from_its_bundle_in_another_directory(tmp_path: Path) -> None:
    import subprocess

    examples = Path(__file__).resolve().parent.parent / "examples"
    report = tmp_path / "report"
    spec = "module:module_state_decoder:decoder_with_position_bug"
    command = [sys.executable, "-m", "maskcheck", "audit", spec, "--suites", "kv_cache", "-q", "--report", str(report)]
    audited = subprocess.run(command, cwd=examples, capture_output=True, text=True, timeout=300)
    assert audited.returncode == 1, audited.stdout[-2000:] + audited.stderr[-2000:]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    replayed = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(report / "repro-kv_cache")],
        cwd=elsewhere, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert replayed.returncode == 1, replayed.stdout[-2000:]
    assert "cached decoding (prefill" in replayed.stdout and "differs from the full forward" in replayed.stdout


def test_a_loss_with_another_ignore_index_is_told_the_wrapper_to_write() -> None:
    import torch.nn.functional as F

    model = ScratchDecoder()
    model.maskcheck_loss = (
        lambda logits, labels: F.cross_entropy(  # type: ignore[assignment]
            logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-1
        )
    )
    model.maskcheck_capabilities["has_loss"] = True
    reference = next(
        c for c in audit(model, ["loss_masking"]).suite("loss_masking").checks if c.name == "reference_loss"
    )
    assert reference.status == "error" and "labels.masked_fill(labels == -100, -1)" in reference.message


def test_a_forward_that_returns_only_the_last_position_is_asked_with_targets() -> None:
    """nanoGPT's forward(idx, targets=None) returns logits[:, [-1]] without targets: before,
    a shape error in every suite; now every position, read through targets."""
    import torch.nn.functional as F

    class LastPositionOnly(ScratchDecoder):
        def forward(self, idx, targets=None):  # type: ignore[no-untyped-def, override]
            logits = super().forward(idx)
            if targets is None:
                return logits[:, [-1]], None
            return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-1)

    model = LastPositionOnly()
    model.maskcheck_capabilities["has_cache"] = False
    assert audit(model, ["causal"], profile="ci").suite("causal").status == "pass"
    ids = torch.randint(1, 64, (2, 5), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(adapter_for(model).logits(Batch(ids)), ScratchDecoder()(ids), atol=1e-6, rtol=0)


def test_a_module_whose_mask_is_an_attention_matrix_over_heads_is_measured_so() -> None:
    """A from-scratch decoder that hands its ``mask`` to SDPA as it is: [B, 1, T, T]. With as
    many rows as heads, a [B, T, T] matrix broadcasts over the heads without an error; the
    measurement sees the first row's mask move the second row and takes the next shape."""
    from maskcheck.reference_models.scratch import ScratchDecoderTakingMask

    adapter = adapter_for(ScratchDecoderTakingMask())
    assert adapter.describe()["mask"].startswith("mask= (an attention matrix [B, 1, T, T], True = may attend")
    result = audit(adapter, ["causal", "padding", "kv_cache"], profile="ci")
    padding = {check.name: check.status for check in result.suite("padding").checks}
    assert result.suite("causal").status == "pass" and padding["pad_ids"] == "pass"
    # Its cache protocol (setup_caches + input_pos) passes no mask: cached prompts are unpadded, and said so.
    kv_cache = result.suite("kv_cache")
    assert kv_cache.status == "pass", kv_cache
    assert all(c.convention and c.convention.startswith("unpadded prompts only") for c in kv_cache.checks)
