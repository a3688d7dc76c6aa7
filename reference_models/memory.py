"""Memory estimates for a reference model: what a forward pass allocates, by component."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import ModelConfig


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes, by component. ``attention_scores`` and ``ffn_activations`` are per layer."""

    parameters: int
    attention_scores: int
    ffn_activations: int
    kv_cache: int

    @property
    def total(self) -> int:
        return self.parameters + self.attention_scores + self.ffn_activations + self.kv_cache


def parameter_count(config: ModelConfig) -> int:
    d, f, v = config.d_model, config.ffn_dim, config.vocab_size
    norm = d if config.norm == "rmsnorm" else 2 * d
    kv = config.kv_heads * config.head_dim
    attention = (d * d + d) * 2 + (d * kv + kv) * 2  # q and o, k and v, with biases
    ffn = (d * f + f) + (f * d + d)
    per_layer = attention + ffn + 2 * norm

    def stack(cross: bool) -> int:
        layer = per_layer + ((attention + norm) if cross else 0)
        extra = 0
        if config.position == "learned":
            extra += config.max_seq_len * d
        if config.token_shift:
            extra += d * d
        return config.n_layers * layer + extra + (norm if config.final_norm else 0)

    count = v * d  # token embedding, shared by encoder and decoder
    if config.family in ("encoder", "encoder_decoder"):
        count += stack(cross=False)
    if config.family in ("decoder", "encoder_decoder"):
        count += stack(cross=config.family == "encoder_decoder")
    if not config.tie_embeddings:
        count += v * d
    if config.family == "encoder":
        count += d * config.num_labels + config.num_labels
    return count


def estimate_memory(
    config: ModelConfig, batch: int, seq_len: int, dtype: torch.dtype = torch.float32
) -> MemoryEstimate:
    """Sizes of the tensors a forward pass of ``batch x seq_len`` tokens holds.

    attention scores: ``B x H x T x T`` per layer; FFN activations: ``B x T x d_ff`` per
    layer; KV cache: keys and values of every decoder layer, ``2 x L x B x Hkv x T x Dh``.
    """
    size = torch.tensor([], dtype=dtype).element_size()
    decoder_layers = config.n_layers if config.family != "encoder" else 0
    return MemoryEstimate(
        parameters=parameter_count(config) * size,
        attention_scores=batch * config.n_heads * seq_len * seq_len * size,
        ffn_activations=batch * seq_len * config.ffn_dim * size,
        kv_cache=2 * decoder_layers * batch * config.kv_heads * seq_len * config.head_dim * size,
    )
