"""The reference Transformer: encoder-only, decoder-only and encoder-decoder in one file.

Masks and caches are explicit arguments and return values; nothing is hidden in
module state. Every tensor of token-level inputs is ``[B, T]``: ``attention_mask``
1 = real token (Hugging Face convention), ``position_ids`` the position of each
token, ``segment_ids`` the packed sequence each token belongs to (block-diagonal
attention). When a :class:`KVCache` is passed, ``attention_mask`` covers the cached
tokens followed by the new ones, as in Hugging Face models.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .layers import (
    Attention,
    FeedForward,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    make_norm,
    rotary_cos_sin,
    sinusoidal_table,
)
from .masks import build_attention_mask, check_padding_mask, prefix_pairs, sequence_ordinals

IGNORE_INDEX = -100


@dataclass(frozen=True)
class KVCache:
    """Everything a decoder needs to continue a sequence. Immutable: a step returns a new one.

    ``keys``/``values`` per layer ``[B, Hkv, T, Dh]`` (keys already rotated);
    ``real [B, T]`` (True at real tokens) and ``positions [B, T]`` of the cached tokens;
    ``token_embeddings [B, T, D]`` of the cached tokens for token shift, which reads the
    last one (``[B, 0, D]`` without token shift); for encoder-decoders the
    cross-attention keys/values, computed once from the source, and ``source_real [B, S]``
    (True at real source tokens).
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    real: Tensor
    positions: Tensor
    token_embeddings: Tensor
    cross_keys: tuple[Tensor, ...] | None = None
    cross_values: tuple[Tensor, ...] | None = None
    source_real: Tensor | None = None

    @property
    def length(self) -> int:
        return self.real.shape[1]

    def without_last(self, tokens: int) -> "KVCache":
        """The cache before its last ``tokens`` tokens (rejected draft tokens rolled back)."""
        keep = self.length - tokens
        return replace(
            self,
            keys=tuple(k[:, :, :keep] for k in self.keys),  # [B, Hkv, T - n, Dh]
            values=tuple(v[:, :, :keep] for v in self.values),
            real=self.real[:, :keep],
            positions=self.positions[:, :keep],
            token_embeddings=self.token_embeddings[:, :keep],
        )

    def rows(self, index: Tensor) -> "KVCache":
        """The cache whose row ``i`` is this one's row ``index[i]`` (beam search, dropped rows)."""

        def pick(t: Tensor) -> Tensor:
            return t.index_select(0, index.to(t.device))

        crossed = self.cross_keys is not None
        return KVCache(
            tuple(pick(k) for k in self.keys),
            tuple(pick(v) for v in self.values),
            pick(self.real),
            pick(self.positions),
            pick(self.token_embeddings),
            tuple(pick(k) for k in self.cross_keys) if crossed else None,  # type: ignore[union-attr]
            tuple(pick(v) for v in self.cross_values) if crossed else None,  # type: ignore[union-attr]
            pick(self.source_real) if self.source_real is not None else None,
        )


@dataclass
class ModelOutput:
    logits: Tensor  # [B, T, V]
    cache: KVCache | None = None


class Block(nn.Module):
    """One layer: self-attention, optional cross-attention, feed-forward; pre- or post-norm."""

    def __init__(self, config: ModelConfig, cross: bool) -> None:
        super().__init__()
        self.pre_norm = config.norm_layout == "pre"
        self.self_attn = Attention(config)
        self.self_norm = make_norm(config)
        self.cross_attn = Attention(config) if cross else None
        self.cross_norm = make_norm(config) if cross else None
        self.ffn = FeedForward(config)
        self.ffn_norm = make_norm(config)

    def _residual(self, x: Tensor, norm: nn.Module, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + sublayer(norm(x))
        return norm(x + sublayer(x))

    def keys_values(
        self, h: Tensor, past: tuple[Tensor, Tensor] | None, rotary: tuple[Tensor, Tensor] | None
    ) -> tuple[Tensor, Tensor]:
        """The self-attention's keys and values ``[B, Hkv, T_past + T, Dh]``: the cached ones,
        then those of the sublayer's input ``h [B, T, D]`` (keys rotated); the cache keeps them."""
        k, v = self.self_attn.project_kv(h)  # [B, Hkv, T, Dh] each
        if rotary is not None:
            k = apply_rotary(k, *rotary)
        if past is not None:
            k = torch.cat([past[0], k], dim=2)  # [B, Hkv, T_past + T, Dh]
            v = torch.cat([past[1], v], dim=2)  # [B, Hkv, T_past + T, Dh]
        return k, v

    def forward(
        self,
        x: Tensor,
        mask: Tensor,
        past: tuple[Tensor, Tensor] | None,
        rotary: tuple[Tensor, Tensor] | None,
        bias: Tensor | None,
        cross: tuple[Tensor, Tensor, Tensor] | None,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """``x [B, T, D]``, ``mask [B, T, T_past + T]`` (True = may attend); returns the layer's
        output and its keys and values for the cache."""
        h = self.self_norm(x) if self.pre_norm else x  # the self-attention sublayer's input
        k, v = self.keys_values(h, past, rotary)
        attended = self.self_attn(h, k, v, mask, rotary, bias)
        x = x + attended if self.pre_norm else self.self_norm(x + attended)
        if self.cross_attn is not None:
            assert cross is not None and self.cross_norm is not None
            cross_k, cross_v, cross_mask = cross
            x = self._residual(x, self.cross_norm, lambda h: self.cross_attn(h, cross_k, cross_v, cross_mask))
        x = self._residual(x, self.ffn_norm, self.ffn)
        return x, (k, v)


class Stack(nn.Module):
    """Embedding plus a stack of blocks plus the optional final norm: one encoder or decoder."""

    def __init__(self, config: ModelConfig, embed: nn.Embedding, causal: bool, cross: bool) -> None:
        super().__init__()
        self.config = config
        self.causal = causal
        self.embed = embed
        if config.position == "learned":
            self.position_embed = nn.Embedding(config.max_seq_len, config.d_model)
        if config.position == "sinusoidal":
            self.register_buffer("sinusoid", sinusoidal_table(config.max_seq_len, config.d_model), persistent=False)
        if config.position == "alibi":
            self.register_buffer("slopes", alibi_slopes(config.n_heads), persistent=False)
        if config.token_shift:
            self.shift_proj = nn.Linear(config.d_model, config.d_model, bias=False)
        self.blocks = nn.ModuleList(Block(config, cross) for _ in range(config.n_layers))
        self.final_norm = make_norm(config) if config.final_norm else None

    def embed_tokens(
        self, input_ids: Tensor, positions: Tensor, real: Tensor, segments: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor]:
        """Token embedding plus absolute positions and token shift; returns (x, the token
        embeddings a cache keeps: ``[B, T, D]`` with token shift, ``[B, 0, D]`` without)."""
        tokens = self.embed(input_ids)  # [B, T, D]
        x = tokens
        if self.config.position == "learned":
            x = x + self.position_embed(positions)
        if self.config.position == "sinusoidal":
            x = x + self.sinusoid[positions].to(x.dtype)
        if self.config.token_shift:
            x = x + self.shift_proj(self.previous_tokens(tokens, real, segments, cache))
        return x, tokens if self.config.token_shift else tokens[:, :0]

    def previous_tokens(self, tokens: Tensor, real: Tensor, segments: Tensor | None, cache: KVCache | None) -> Tensor:
        """Each position's previous token embedding, zero where that token is not real (padding),
        another packed segment, or before the start of the sequence."""
        if cache is None:
            first = torch.zeros_like(tokens[:, :1])
            first_real = torch.zeros_like(real[:, :1])
        else:
            first, first_real = cache.token_embeddings[:, -1:], cache.real[:, -1:]
        previous = torch.cat([first, tokens[:, :-1]], dim=1)  # [B, T, D]
        new_real = real[:, -tokens.shape[1] :]  # [B, T]
        keep = torch.cat([first_real, new_real[:, :-1]], dim=1)  # [B, T]: previous token is real
        if segments is not None:
            same_segment = torch.ones_like(keep)
            same_segment[:, 1:] = segments[:, 1:] == segments[:, :-1]
            keep = keep & same_segment
        return previous * keep[..., None].to(previous.dtype)

    def layer_mask(self, layer: int, mask: Tensor) -> Tensor:
        """The mask a given layer uses; the same for every layer (a hook for seeded bugs)."""
        return mask

    def build_mask(self, q_index: Tensor, k_index: Tensor, real: Tensor, segments: Tensor | None, batch: int) -> Tensor:
        """``[B, T, T_past + T]``; ``real [B, T_past + T]`` True at real tokens."""
        chunks = self.chunk_ids(real, segments)  # [B, T_past + T] or None
        return build_attention_mask(
            q_index=q_index,
            k_index=k_index,
            causal=self.causal,
            window=self.config.sliding_window,
            sinks=self.config.attention_sinks,
            key_real=real,
            q_segments=segments,
            k_segments=segments,
            q_chunks=None if chunks is None else chunks[:, -q_index.numel() :],
            k_chunks=chunks,
            batch=batch,
        )

    def chunk_ids(self, real: Tensor, segments: Tensor | None) -> Tensor | None:
        """``[B, T_past + T]``: each token's attention chunk, counted from its sequence's first
        real token; None without chunked attention."""
        if self.config.attention_chunk is None:
            return None
        return sequence_ordinals(real, segments) // self.config.attention_chunk

    def with_prefix(self, mask: Tensor, prefix: Tensor, real: Tensor, segments: Tensor | None) -> Tensor:
        """``mask [B, T, T]`` of a forward without a cache, with the tokens of each sequence's
        bidirectional prefix (``prefix [B, T]`` True there) reading each other both ways."""
        return mask | prefix_pairs(prefix, real, segments)

    def forward(
        self,
        input_ids: Tensor,
        real: Tensor,
        positions: Tensor,
        segments: Tensor | None = None,
        cache: KVCache | None = None,
        cross: tuple[tuple[Tensor, ...], tuple[Tensor, ...], Tensor] | None = None,
        prefix: Tensor | None = None,
    ) -> tuple[Tensor, KVCache]:
        """``real [B, T_past + T]`` True at real tokens; ``positions [B, T]`` of the new tokens;
        ``prefix [B, T]`` True at the new tokens of a bidirectional prefix (no cache: a cached
        forward continues after the prefix)."""
        batch, length = input_ids.shape
        past_length = 0 if cache is None else cache.length
        x, embeddings = self.embed_tokens(input_ids, positions, real, segments, cache)
        if cache is not None and cache.keys:
            embeddings = torch.cat([cache.token_embeddings, embeddings], dim=1)  # [B, T_past + T, D]
        device = input_ids.device
        q_index = torch.arange(past_length, past_length + length, device=device)
        k_index = torch.arange(past_length + length, device=device)
        mask = self.build_mask(q_index, k_index, real, segments, batch)  # [B, T, T_past + T]
        if prefix is not None:
            mask = self.with_prefix(mask, prefix, real, segments)
        all_positions = positions if cache is None else torch.cat([cache.positions, positions], dim=1)
        rotary = None
        if self.config.position == "rotary":
            rotary = rotary_cos_sin(positions, self.config.head_dim, self.config.rope_theta, x.dtype)
        bias = alibi_bias(self.slopes, positions, all_positions) if self.config.position == "alibi" else None
        keys, values = [], []
        for i, block in enumerate(self.blocks):
            past = None if cache is None else (cache.keys[i], cache.values[i])
            layer_cross = None if cross is None else (cross[0][i], cross[1][i], cross[2])
            x, (k, v) = block(x, self.layer_mask(i, mask), past, rotary, bias, layer_cross)
            keys.append(k)
            values.append(v)
        if self.final_norm is not None:
            x = self.final_norm(x)
        new_cache = KVCache(tuple(keys), tuple(values), real, all_positions, embeddings)
        return x, new_cache


class Transformer(nn.Module):
    """A reference Transformer of any family; see :class:`ModelConfig`."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        has_encoder = config.family in ("encoder", "encoder_decoder")
        has_decoder = config.family in ("decoder", "encoder_decoder")
        self.encoder = Stack(config, self.embed, causal=False, cross=False) if has_encoder else None
        cross = config.family == "encoder_decoder"
        self.decoder = Stack(config, self.embed, causal=True, cross=cross) if has_decoder else None
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.classifier = nn.Linear(config.d_model, config.num_labels) if config.family == "encoder" else None
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.config.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    # -- inputs ---------------------------------------------------------------------------

    def _inputs(
        self, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor | None, cache: KVCache | None
    ) -> tuple[Tensor, Tensor]:
        """The real tokens ``real [B, T_past + T]`` (True = real, from ``attention_mask``) and the
        position ids ``[B, T]``, validated and defaulted."""
        if input_ids.dim() != 2 or input_ids.dtype not in (torch.long, torch.int):
            raise TypeError(
                f"input_ids must be an integer tensor [B, T], got {input_ids.dtype} {list(input_ids.shape)}"
            )
        batch, length = input_ids.shape
        past_length = 0 if cache is None else cache.length
        if attention_mask is None:
            attention_mask = torch.ones(batch, past_length + length, dtype=torch.bool, device=input_ids.device)
        real = check_padding_mask(attention_mask, batch, past_length + length)
        if position_ids is None:
            position_ids = torch.arange(past_length, past_length + length, device=input_ids.device).expand(batch, -1)
        if tuple(position_ids.shape) != (batch, length):
            raise ValueError(f"position_ids must have shape [{batch}, {length}], got {list(position_ids.shape)}")
        if self.config.position in ("learned", "sinusoidal") and int(position_ids.max()) >= self.config.max_seq_len:
            raise ValueError(f"position {int(position_ids.max())} is beyond max_seq_len={self.config.max_seq_len}")
        return real, position_ids

    def _prefix(self, prefix_mask: Tensor | None, input_ids: Tensor, cache: KVCache | None) -> Tensor | None:
        """The validated prefix ``[B, T]`` (True = prefix token), or None."""
        if prefix_mask is None:
            return None
        if not self.config.prefix_lm:
            raise ValueError("prefix_mask is for a prefix LM (ModelConfig.prefix_lm=True)")
        prefix = check_padding_mask(prefix_mask, *input_ids.shape, "prefix_mask", "1 = prefix token and 0 = the rest")
        if cache is not None and bool(prefix.any()):
            raise ValueError("a cached forward cannot extend a bidirectional prefix: prefill the whole prefix at once")
        return None if cache is not None else prefix

    # -- forward passes -------------------------------------------------------------------

    def encode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        segment_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """Run the encoder; returns hidden states ``[B, S, D]`` and the source's real tokens ``[B, S]``."""
        assert self.encoder is not None, "this model has no encoder"
        real, position_ids = self._inputs(input_ids, attention_mask, position_ids, None)
        hidden, _ = self.encoder(input_ids, real, position_ids, segment_ids)
        return hidden, real

    def forward(
        self,
        input_ids: Tensor | None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        segment_ids: Tensor | None = None,
        cache: KVCache | None = None,
        decoder_input_ids: Tensor | None = None,
        decoder_attention_mask: Tensor | None = None,
        decoder_position_ids: Tensor | None = None,
        prefix_mask: Tensor | None = None,
    ) -> ModelOutput:
        """Logits ``[B, T, V]`` over the predicted positions, and the cache to continue from.

        Encoder: MLM logits over ``input_ids``. Decoder: next-token logits. Encoder-decoder:
        ``input_ids`` is the source (ignored when ``cache`` already holds it) and the logits
        are over ``decoder_input_ids``. ``prefix_mask [B, T]`` (a prefix LM's decoder only):
        1 at the tokens of each sequence's bidirectional prefix.
        """
        if self.config.family == "encoder":
            assert input_ids is not None
            hidden, _ = self.encode(input_ids, attention_mask, position_ids, segment_ids)
            return ModelOutput(self.lm_head(hidden))
        if self.config.family == "decoder":
            assert input_ids is not None
            return self._decode(input_ids, attention_mask, position_ids, segment_ids, cache, prefix_mask)
        if decoder_input_ids is None:
            raise ValueError("an encoder-decoder needs decoder_input_ids")
        if segment_ids is not None and cache is None:
            raise ValueError("packing (segment_ids) is supported for encoders and decoders, not encoder-decoders")
        source = cache if cache is not None else self._cross_cache(input_ids, attention_mask, position_ids, segment_ids)
        return self._decode_from_source(source, decoder_input_ids, decoder_attention_mask, decoder_position_ids, cache)

    def _decode(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None,
        position_ids: Tensor | None,
        segment_ids: Tensor | None,
        cache: KVCache | None,
        prefix_mask: Tensor | None,
    ) -> ModelOutput:
        """A decoder-only model's next-token logits ``[B, T, V]`` and its cache."""
        assert self.decoder is not None
        real, position_ids = self._inputs(input_ids, attention_mask, position_ids, cache)
        prefix = self._prefix(prefix_mask, input_ids, cache)
        hidden, new_cache = self.decoder(input_ids, real, position_ids, segment_ids, cache, prefix=prefix)
        return ModelOutput(self.lm_head(hidden), new_cache)

    def _decode_from_source(
        self,
        source: KVCache,
        decoder_input_ids: Tensor,
        decoder_attention_mask: Tensor | None,
        decoder_position_ids: Tensor | None,
        cache: KVCache | None,
    ) -> ModelOutput:
        """An encoder-decoder's logits ``[B, T, V]`` over ``decoder_input_ids``, reading the
        encoded source that ``source`` holds (its cross-attention keys and values, computed once)."""
        assert self.decoder is not None
        assert source.cross_keys is not None and source.cross_values is not None and source.source_real is not None
        real, decoder_position_ids = self._inputs(
            decoder_input_ids, decoder_attention_mask, decoder_position_ids, cache
        )
        cross_mask = self.cross_mask(source.source_real, decoder_input_ids.shape[1])  # [B, T, S]
        cross = (source.cross_keys, source.cross_values, cross_mask)
        hidden, new_cache = self.decoder(decoder_input_ids, real, decoder_position_ids, None, cache, cross)
        new_cache = replace(
            new_cache, cross_keys=source.cross_keys, cross_values=source.cross_values, source_real=source.source_real
        )
        return ModelOutput(self.lm_head(hidden), new_cache)

    def cross_mask(self, source_real: Tensor, length: int) -> Tensor:
        """``[B, T, S]`` bool: every decoder position may read every real source token."""
        return source_real[:, None, :].expand(-1, length, -1)

    def _cross_cache(
        self,
        input_ids: Tensor | None,
        attention_mask: Tensor | None,
        position_ids: Tensor | None,
        segment_ids: Tensor | None,
    ) -> KVCache:
        """Encode the source and project it to every decoder layer's cross-attention keys/values."""
        if input_ids is None:
            raise ValueError("an encoder-decoder needs input_ids (the source) when no cache is given")
        if segment_ids is not None:
            raise ValueError("packing (segment_ids) is supported for encoders and decoders, not encoder-decoders")
        assert self.decoder is not None
        memory, source_real = self.encode(input_ids, attention_mask, position_ids)
        projected = [block.cross_attn.project_kv(memory) for block in self.decoder.blocks]  # type: ignore[union-attr]
        empty = torch.zeros(0)
        return KVCache(
            keys=(),
            values=(),
            real=empty,
            positions=empty,
            token_embeddings=empty,
            cross_keys=tuple(k for k, _ in projected),
            cross_values=tuple(v for _, v in projected),
            source_real=source_real,
        )

    def classify(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """Sequence classification logits ``[B, num_labels]`` from the mean over real tokens."""
        assert self.classifier is not None, "classify() is for encoder models"
        hidden, real = self.encode(input_ids, attention_mask)
        weights = real[..., None].to(hidden.dtype)  # [B, S, 1]
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)  # [B, D]
        return self.classifier(pooled)

    # -- loss -----------------------------------------------------------------------------

    def loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Cross-entropy, mean over valid targets, ``-100`` ignored.

        Decoders predict the next token, so position t is scored against ``labels[t + 1]``
        (labels are passed unshifted, as in Hugging Face). Encoders (MLM) and
        encoder-decoders score position t against ``labels[t]``.
        """
        if self.config.family == "decoder":
            logits, labels = logits[:, :-1], labels[:, 1:]
        return F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX
        )
