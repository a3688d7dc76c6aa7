"""The reference models: shapes, positions, caches, packing, checkpoints, memory."""

from __future__ import annotations

import itertools

import pytest
import torch

from maskcheck.reference_models import (
    PRESETS,
    CheckpointError,
    ModelConfig,
    Transformer,
    estimate_memory,
    load_checkpoint,
    parameter_count,
    save_checkpoint,
)
from maskcheck.reference_models.layers import sinusoidal_table
from maskcheck.reference_models.masks import (
    check_padding_mask,
    positions_from_mask,
    positions_from_segments,
)

torch.manual_seed(0)


def build(config: ModelConfig) -> Transformer:
    torch.manual_seed(0)
    return Transformer(config).eval()


def ids(batch: int, length: int, vocab: int = 64, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# Pairwise coverage of the options that interact, rather than their full product.
OPTION_SETS = [
    dict(norm_layout="pre", final_norm=True, norm="layernorm", position="rotary", n_kv_heads=None, token_shift=False),
    dict(norm_layout="post", final_norm=False, norm="rmsnorm", position="learned", n_kv_heads=2, token_shift=True),
    dict(norm_layout="pre", final_norm=False, norm="rmsnorm", position="alibi", n_kv_heads=1, token_shift=False),
    dict(norm_layout="post", final_norm=True, norm="layernorm", position="sinusoidal", n_kv_heads=1, token_shift=True),
    dict(
        norm_layout="pre", final_norm=True, norm="rmsnorm", position="sinusoidal", n_kv_heads=2, norm_unit_offset=True
    ),
    dict(norm_layout="post", final_norm=True, norm="rmsnorm", position="alibi", n_kv_heads=None, token_shift=True),
]
FAMILIES = ["decoder", "encoder", "encoder_decoder"]
VARIANTS = [ModelConfig(family=f, **o) for f, o in itertools.product(FAMILIES, OPTION_SETS)]


def variant_id(config: ModelConfig) -> str:
    return f"{config.family}-{config.norm_layout}-{config.norm}-{config.position}-kv{config.kv_heads}"


@pytest.mark.parametrize("config", VARIANTS, ids=variant_id)
def test_shapes_for_every_family_and_option(config: ModelConfig) -> None:
    model = build(config)
    x = ids(2, 7)
    if config.family == "encoder_decoder":
        out = model(x, decoder_input_ids=ids(2, 5, seed=1))
        assert out.logits.shape == (2, 5, config.vocab_size)
    else:
        out = model(x)
        assert out.logits.shape == (2, 7, config.vocab_size)
    if config.family == "encoder":
        assert model.classify(x).shape == (2, config.num_labels)
    assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize("dim", [1, 7, 30, 31, 32])
def test_sinusoidal_table_odd_and_even_width(dim: int) -> None:
    table = sinusoidal_table(10, dim)
    assert table.shape == (10, dim)
    assert torch.allclose(table[0, 0::2], torch.zeros((dim + 1) // 2))  # sin(0)
    assert torch.allclose(table[0, 1::2], torch.ones(dim // 2))  # cos(0)
    assert torch.allclose(table[3, 0], torch.sin(torch.tensor(3.0)))


def test_head_dimension() -> None:
    config = ModelConfig(d_model=256, n_heads=8)
    assert config.head_dim == 32
    model = build(config)
    assert model.decoder.blocks[0].self_attn.q_proj.out_features == 8 * 32


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(d_model=30, n_heads=4), "divisible"),
        (dict(n_heads=4, n_kv_heads=3), "multiple"),
        (dict(family="encoder", sliding_window=4), "causal"),
        (dict(d_model=12, n_heads=4, position="rotary"), "even head_dim"),
        (dict(norm="layernorm", norm_unit_offset=True), "rmsnorm"),
        (dict(position="fourier"), "position"),
    ],
)
def test_config_is_validated(bad: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**bad)


def test_mask_of_wrong_dtype_or_shape_is_refused() -> None:
    model = build(ModelConfig())
    x = ids(2, 5)
    with pytest.raises(TypeError, match="additive float mask"):
        model(x, attention_mask=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="shape"):
        model(x, attention_mask=torch.ones(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="only 0 and 1"):
        check_padding_mask(torch.full((1, 3), 2), 1, 3)


def test_position_helpers() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0]])
    assert positions_from_mask(mask).tolist() == [[0, 0, 0, 1, 2], [0, 1, 2, 2, 2]]
    segments = torch.tensor([[0, 0, 1, 1, 1, 2]])
    assert positions_from_segments(segments).tolist() == [[0, 1, 0, 1, 2, 0]]


CACHED = [c for c in VARIANTS if c.family != "encoder"] + [
    ModelConfig(sliding_window=3, n_layers=2),
    ModelConfig(sliding_window=2, position="alibi"),
]


@pytest.mark.parametrize("config", CACHED, ids=variant_id)
def test_kv_cache_equals_full_forward_with_left_padding(config: ModelConfig) -> None:
    model = build(config)
    x = ids(2, 9)
    mask = torch.ones(2, 9, dtype=torch.long)
    mask[1, :3] = 0  # row 1 is left-padded
    positions = positions_from_mask(mask)
    source = ids(2, 4, seed=3) if config.family == "encoder_decoder" else None

    def run(tokens, m, pos, cache=None):  # type: ignore[no-untyped-def]
        if config.family == "encoder_decoder":
            return model(
                source, decoder_input_ids=tokens, decoder_attention_mask=m, decoder_position_ids=pos, cache=cache
            )
        return model(tokens, m, pos, cache=cache)

    full = run(x, mask, positions).logits
    pieces, cache = [], None
    for start, stop in [(0, 4), (4, 5), (5, 8), (8, 9)]:  # chunks of 4, 1, 3 and 1 tokens
        out = run(x[:, start:stop], mask[:, :stop], positions[:, start:stop], cache)
        pieces.append(out.logits)
        cache = out.cache
    incremental = torch.cat(pieces, dim=1)
    real = mask.bool()
    torch.testing.assert_close(incremental[real], full[real], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("config", [c for c in VARIANTS if c.family != "encoder_decoder"], ids=variant_id)
def test_packed_segments_equal_separate_runs(config: ModelConfig) -> None:
    model = build(config)
    a, b = ids(1, 4, seed=1), ids(1, 3, seed=2)
    packed = torch.cat([a, b], dim=1)
    segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
    out = model(packed, position_ids=positions_from_segments(segments), segment_ids=segments).logits
    torch.testing.assert_close(out[:, :4], model(a).logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[:, 4:], model(b).logits, atol=1e-5, rtol=1e-5)


def test_checkpoint_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    config = PRESETS["tiny-encoder-decoder"]
    model = build(config)
    path = save_checkpoint(model, tmp_path / "model.safetensors")
    loaded = load_checkpoint(path)
    assert loaded.config == config
    x, y = ids(2, 5), ids(2, 4, seed=1)
    torch.testing.assert_close(loaded(x, decoder_input_ids=y).logits, model(x, decoder_input_ids=y).logits)


@pytest.mark.parametrize(
    "change",
    [dict(norm_layout="post"), dict(final_norm=False), dict(norm="rmsnorm"), dict(position="learned")],
    ids=str,
)
def test_loading_into_another_architecture_is_refused(tmp_path, change: dict) -> None:  # type: ignore[no-untyped-def]
    path = save_checkpoint(build(ModelConfig()), tmp_path / "model.safetensors")
    field = next(iter(change))
    with pytest.raises(CheckpointError, match=f"{field}: saved"):
        load_checkpoint(path, ModelConfig().replace(**change))


def test_truncated_checkpoint_is_a_clear_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = save_checkpoint(build(ModelConfig()), tmp_path / "model.safetensors")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    "name", ["tiny-decoder-gqa", "tiny-encoder", "tiny-encoder-decoder", "tiny-decoder-sinusoidal-shift"]
)
def test_memory_estimate_matches_real_tensors(name: str) -> None:
    config = PRESETS[name]
    model = build(config)
    assert parameter_count(config) == sum(p.numel() for p in model.parameters())
    batch, length = 3, 11
    estimate = estimate_memory(config, batch, length)
    assert estimate.parameters == sum(p.numel() * p.element_size() for p in model.parameters())

    scores, ffn = [], []
    hooks = [(model.decoder or model.encoder).blocks[0].ffn.up.register_forward_hook(lambda m, i, o: ffn.append(o))]
    original_softmax = torch.softmax

    def spy(x, dim):  # type: ignore[no-untyped-def]
        scores.append(x)
        return original_softmax(x, dim)

    torch.softmax = spy  # type: ignore[assignment]
    try:
        x = ids(batch, length)
        if config.family == "encoder_decoder":
            out = model(x, decoder_input_ids=ids(batch, length, seed=1))
        else:
            out = model(x)
    finally:
        torch.softmax = original_softmax  # type: ignore[assignment]
        for hook in hooks:
            hook.remove()
    assert scores[0].numel() * 4 == estimate.attention_scores  # softmax runs in float32
    assert ffn[-1].numel() * ffn[-1].element_size() == estimate.ffn_activations
    if config.family != "encoder":
        cache = out.cache
        cached = sum(
            k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in zip(cache.keys, cache.values)
        )
        assert cached == estimate.kv_cache
