"""Third-party Transformers, wrapped for maskcheck in the fewest lines each takes.

What maskcheck finds by itself: the mask keyword (by name) and its polarity (measured),
the cache calls (by their shape), the vocabulary (from the logits). What each model must
say is what it is: ``maskcheck_capabilities``. Audit one with::

    maskcheck audit module:third_party:x_decoder
"""

from __future__ import annotations

import torch
from torch import nn


def x_decoder() -> nn.Module:
    """x-transformers' decoder: its forward takes ``mask=`` (True = real token), found and measured.
    Rotary positions: attention depends on relative distances, which left padding does not change."""
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(0)
    layers = Decoder(dim=32, depth=2, heads=2, rotary_pos_emb=True)
    model = TransformerWrapper(num_tokens=64, max_seq_len=64, use_abs_pos_emb=False, attn_layers=layers).eval()
    model.maskcheck_capabilities = {"family": "decoder", "vocab_size": 64, "max_length": 64}
    return model


def x_encoder() -> nn.Module:
    """x-transformers' encoder (attention both ways: the family's default pattern)."""
    from x_transformers import Encoder, TransformerWrapper

    torch.manual_seed(0)
    layers = Encoder(dim=32, depth=2, heads=2, rotary_pos_emb=True)
    model = TransformerWrapper(num_tokens=64, max_seq_len=64, use_abs_pos_emb=False, attn_layers=layers).eval()
    model.maskcheck_capabilities = {"family": "encoder", "vocab_size": 64, "max_length": 64}
    return model


def torchtune_decoder() -> nn.Module:
    """torchtune's llama3 at a tiny size, as torchtune builds it: nothing to declare. Its
    ``mask=`` is measured to be an attention matrix, ``input_pos`` is its position ids, and
    its KV cache is driven as torchtune's ``generate()`` drives it."""
    from torchtune.models.llama3 import llama3

    torch.manual_seed(0)
    return llama3(
        vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=64, intermediate_dim=64
    ).eval()


class TorchEncoder(nn.Module):
    """PyTorch's own ``nn.TransformerEncoder`` under an embedding and a head: the padding mask is
    its ``src_key_padding_mask`` (True = padding), found by name and its polarity measured."""

    def __init__(self, vocab_size: int = 64, width: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.head = nn.Embedding(vocab_size, width), nn.Linear(width, vocab_size)
        layer = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.maskcheck_capabilities = {"family": "encoder", "vocab_size": vocab_size}

    def forward(self, input_ids: torch.Tensor, src_key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.head(self.encoder(self.embed(input_ids), src_key_padding_mask=src_key_padding_mask))


def torch_encoder() -> nn.Module:
    return TorchEncoder().eval()


def hooked_transformer() -> nn.Module:
    """TransformerLens's HookedTransformer (3.9), built from a config: its forward takes
    ``attention_mask=`` (found and measured), and its token embedding, an ``Embed`` module
    holding its own ``W_E``, is found by measurement for the gradient checks."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    config = HookedTransformerConfig(
        n_layers=2, d_model=32, n_ctx=64, d_head=8, n_heads=4, d_vocab=64, act_fn="gelu",
        normalization_type="LN", positional_embedding_type="rotary", seed=0,
    )  # fmt: skip
    model = HookedTransformer(config).eval()
    model.maskcheck_capabilities = {"family": "decoder", "vocab_size": 64, "max_length": 64}
    return model


def cached_hooked_transformer() -> nn.Module:
    """The same model with its KV cache: ``past_kv_cache=``, an object the forward updates in
    place, given the object-cache protocol in six lines (each call gets the new tokens' mask,
    and the cache appends it to the mask it keeps)."""
    from transformer_lens.cache.key_value_cache import TransformerLensKeyValueCache

    model = hooked_transformer()

    def prefill(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, object]:
        cache = TransformerLensKeyValueCache.init_cache(model.cfg, model.cfg.device, input_ids.shape[0])
        return model(input_ids, attention_mask=attention_mask, past_kv_cache=cache), cache

    def step(cache: object, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, object]:
        new = attention_mask[:, -input_ids.shape[1] :]  # the step's own tokens: the cache keeps the rest
        return model(input_ids, attention_mask=new, past_kv_cache=cache), cache

    model.prefill, model.step = prefill, step
    model.maskcheck_capabilities = {**model.maskcheck_capabilities, "has_cache": True}
    return model
