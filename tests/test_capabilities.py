"""Capabilities measured, not guessed: what a model takes is read from what runs, and a
check is not applicable only when its input truly cannot be given."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from maskcheck import audit
from maskcheck.harness.adapters.base import Capabilities
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.module import ModuleAdapter
from maskcheck.reference_models.hf_tiny import shrunk_model, tiny_model
from maskcheck.reference_models.plain import plain_decoder


def wrapped_llama(loss_counts_ignored_labels: bool) -> object:
    """A Llama whose instance forward is replaced by ``forward(*args, labels=None, **kwargs)``
    without functools.wraps, as monkeypatches and training frameworks do."""
    model = tiny_model("llama", "sdpa")
    original = model.forward

    def forward(*args, labels=None, **kwargs):  # type: ignore[no-untyped-def]
        output = original(*args, labels=labels, **kwargs)
        if labels is not None and loss_counts_ignored_labels:
            # A hand-written loss that scores -100 as token 0: ignored labels are counted.
            logits = output.logits[:, :-1]
            output.loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].clamp(min=0).reshape(-1))
        return output

    model.forward = forward
    return model


def test_a_wrapped_forward_keeps_its_mask_and_loss() -> None:
    adapter = HFAdapter(wrapped_llama(loss_counts_ignored_labels=False))
    assert adapter.capabilities.takes_attention_mask and adapter.capabilities.has_loss
    result = audit(adapter, ["padding", "loss_masking"])
    assert [s.status for s in result.suites] == ["pass", "pass"], [(s.name, s.worst_check()) for s in result.suites]


def test_a_wrapped_forward_with_a_wrong_loss_fails_loss_masking() -> None:
    result = audit(HFAdapter(wrapped_llama(loss_counts_ignored_labels=True)), ["loss_masking"])
    assert result.suite("loss_masking").status == "fail"


def test_a_forward_that_returns_no_loss_has_none() -> None:
    model = tiny_model("llama", "sdpa")
    original = model.forward

    def no_loss(*args, labels=None, **kwargs):  # type: ignore[no-untyped-def]
        return original(*args, **kwargs)  # drops the labels: the output's loss is None

    model.forward = no_loss
    assert HFAdapter(model).capabilities.has_loss is False


# -- plain modules: keywords, a cache of their own, positions under left padding -----------------


class SegmentDecoder(nn.Module):
    """Packs by segment ids, taken as a keyword: attention stays inside a segment."""

    def __init__(self, ignore_segments: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.ignore_segments = ignore_segments
        self.embed, self.head = nn.Embedding(16, 8), nn.Linear(8, 16)

    def forward(self, input_ids, attention_mask, segment_ids=None):  # type: ignore[no-untyped-def]
        x = self.embed(input_ids)  # [B, T, C]
        length = input_ids.shape[1]
        allowed = (
            torch.ones(length, length, dtype=torch.bool).tril()[None] & attention_mask.bool()[:, None, :]
        )  # [B, T, T]
        if segment_ids is not None and not self.ignore_segments:
            allowed = allowed & (segment_ids[:, :, None] == segment_ids[:, None, :])
        allowed = allowed | torch.eye(length, dtype=torch.bool)[None]
        weights = torch.where(allowed, 0.0, float("-inf")).softmax(-1)  # [B, T, T]: a mean over what may be read
        return self.head(weights @ x)


def test_a_plain_module_gets_its_segment_ids_as_a_keyword() -> None:
    caps = Capabilities(family="decoder", vocab_size=16, packing="segment_ids")
    assert (
        audit(ModuleAdapter(SegmentDecoder(), caps, mask_convention="keep"), ["packing"]).suite("packing").status
        == "pass"
    )
    leaking = audit(
        ModuleAdapter(SegmentDecoder(ignore_segments=True), caps, mask_convention="keep"), ["packing"]
    ).suite("packing")
    assert leaking.status == "fail" and "segment_isolation" in [c.name for c in leaking.checks if c.status == "fail"]


def test_a_capability_the_forward_cannot_take_is_refused() -> None:
    def forward(input_ids, attention_mask):  # type: ignore[no-untyped-def]
        return torch.zeros(*input_ids.shape, 16)

    with pytest.raises(ValueError, match="declare packing=segment_ids, but the model's forward takes no 'segment_ids'"):
        ModuleAdapter(forward, Capabilities(family="decoder", vocab_size=16, packing="segment_ids"))


def test_a_plain_module_with_its_own_cache_and_its_seeded_bug() -> None:
    clean = audit(plain_decoder(), ["kv_cache"]).suite("kv_cache")
    assert clean.status == "pass", clean.worst_check()
    buggy = audit("mutant:module_cache_step_reads_padding", ["kv_cache"]).suite("kv_cache")
    failed = {c.name: c for c in buggy.checks if c.status == "fail"}
    assert "greedy_generation" in failed and failed["greedy_generation"].case["prompt_lengths"] == (1, 2)


class AbsolutePositions(nn.Module):
    """A decoder whose positions are column indices: left padding shifts them, and it takes no position ids."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.position, self.head = nn.Embedding(16, 8), nn.Embedding(32, 8), nn.Linear(8, 16)

    def forward(self, input_ids, attention_mask):  # type: ignore[no-untyped-def]
        length = input_ids.shape[1]
        x = self.embed(input_ids) + self.position(torch.arange(length))  # [B, T, C]
        allowed = torch.ones(length, length, dtype=torch.bool).tril()[None] & attention_mask.bool()[:, None, :]
        allowed = allowed | torch.eye(length, dtype=torch.bool)[None]
        return self.head(torch.where(allowed, 0.0, float("-inf")).softmax(-1) @ x)


def test_a_decoder_whose_positions_ignore_left_padding_fails() -> None:
    """Batched generation must left-pad a decoder-only model and nothing the caller passes
    fixes its positions: fail. An encoder-decoder's convention is right padding: warn."""
    padding = audit(
        ModuleAdapter(AbsolutePositions(), Capabilities(family="decoder", vocab_size=16), mask_convention="keep"),
        ["padding"],
    ).suite("padding")
    checks = {c.name: c for c in padding.checks}
    assert checks["pad_ids"].status == "pass"  # the mask itself is right
    assert (
        checks["padded_vs_unpadded"].status == "fail"
        and "nothing a caller passes can fix it" in checks["padded_vs_unpadded"].message
    )


@pytest.mark.parametrize("model_type, task", [("roberta", "masked-lm"), ("mpt", "causal-lm")])
def test_models_without_a_packing_input_are_measured_when_packed(model_type: str, task: str) -> None:
    """An encoder (RoBERTa), an ALiBi decoder without position ids (MPT) and a plain module
    are packed anyway by flattening collators: a leak is a warn that says so, never not_applicable."""
    packing = audit(HFAdapter(shrunk_model(model_type, task)), ["packing"]).suite("packing")
    assert packing.status == "warn" and packing.checks[0].message.startswith(
        "not safe to pack: changing packed sequence"
    )
    plain = audit(plain_decoder(), ["packing"]).suite("packing")
    assert plain.status == "warn" and "no input of this model isolates packed sequences" in plain.checks[0].message


# -- sliding windows checked per layer, at their real width --------------------------------------


def windowed(config_class: str, attn: str, **window: object) -> object:
    import transformers

    config = getattr(transformers, config_class)(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        **window,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()


@pytest.mark.parametrize(
    "config_class, attn, window",
    [
        ("MistralConfig", "sdpa", {"sliding_window": 4096, "max_position_embeddings": 4200}),  # every layer sliding
        ("Gemma2Config", "eager", {"sliding_window": 300, "max_position_embeddings": 1024}),  # sliding, then full
    ],
)
def test_each_layer_keeps_its_declared_window_at_real_width(config_class: str, attn: str, window: dict) -> None:
    adapter = HFAdapter(windowed(config_class, attn, **window))
    declared = [layer.width for layer in adapter.declared_layers()]
    assert declared == ([4096, 4096] if config_class == "MistralConfig" else [300, None])
    check = next(c for c in audit(adapter, ["causal"]).suite("causal").checks if c.name == "layer_windows")
    assert check.status == "pass", check.message


def test_a_window_the_mask_builder_drops_fails_per_layer() -> None:
    """At 512 tokens the window is far past the toy-size pattern check (which passes); the
    per-layer check sees every layer read 519 positions back."""
    checks = {c.name: c for c in audit("mutant:hf_mistral_window_dropped", ["causal"]).suite("causal").checks}
    assert checks["declared_pattern"].status == "pass"
    assert checks["layer_windows"].status == "fail"
    assert "layer 0 (sliding window W=512) reads keys up to 519 positions back" in checks["layer_windows"].message


def test_a_window_no_layer_uses_declares_no_per_layer_check() -> None:
    """A config with a sliding_window value but only full-attention layers (Mellum) has no
    window to verify: no layer_windows check, no error."""
    from types import SimpleNamespace

    from maskcheck.harness.adapters.hf_probes import declared_layers
    from maskcheck.harness.adapters.layer_attention import LayerAttention

    config = windowed("MistralConfig", "sdpa", sliding_window=8, max_position_embeddings=64).config
    assert declared_layers(config) == (LayerAttention("sliding", 8),) * 2
    config.layer_types = ["full_attention", "full_attention"]
    assert declared_layers(config) is None
    assert declared_layers(SimpleNamespace(sliding_window=None)) is None
