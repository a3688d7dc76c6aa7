"""The plain decoder (``plain.py``) ported the way people port a model: GPT-2's module names
and attention written out by hand, the same function.

It is ``maskcheck compare``'s clean pair of renamed modules: every module of
:class:`~maskcheck.reference_models.plain.PlainDecoder` exists here under another name
(``embed`` is ``wte``, ``layers.0.qkv`` is ``h.0.attn.c_attn``, ...), and the attention is
``softmax(q k^T / sqrt(d))`` with masked keys at ``-inf`` where the original calls
``scaled_dot_product_attention``, so the two agree up to rounding and never bit for bit.
:func:`port_key` maps the original's state-dict keys to the port's. The cache protocol
(``prefill``, ``step``, the serving methods) is the original's: the port renames modules,
not the cache.

Masks: 1/True = real token, as in ``plain.py``.
"""

from __future__ import annotations

import math
import re

import torch
from torch import Tensor, nn

from .plain import KeyMask, LayerCache, PlainCache, PlainDecoder, advance_positions, plain_capabilities


class PortedAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x: Tensor, real: Tensor, cache: LayerCache, key_mask: KeyMask) -> Tensor:
        """``real [B, T]`` of the new tokens; appends their keys and values to ``cache``."""
        batch, length, width = x.shape
        q, k, v = self.c_attn(x).split(width, dim=-1)  # each [B, T, C]
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        k, v, real = cache.append(k, v, real)  # [B, H, T_so_far + T, D] twice, [B, T_so_far + T]
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, H, T, T_so_far + T]
        attended = self.probabilities(scores, key_mask(real, length)) @ v  # [B, H, T, D]
        return self.c_proj(attended.transpose(1, 2).reshape(batch, length, width))  # [B, T, C]

    def probabilities(self, scores: Tensor, allowed: Tensor) -> Tensor:
        """``softmax`` of ``scores [B, H, T, S]`` over the keys ``allowed`` (True: may be read;
        every query keeps one), masked keys at ``-inf``."""
        return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)


class PortedMLP(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.c_fc = nn.Linear(width, 2 * width)
        self.act = nn.GELU()
        self.c_proj = nn.Linear(2 * width, width)

    def forward(self, x: Tensor) -> Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class PortedBlock(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(width)
        self.attn = PortedAttention(width, heads)
        self.ln_2 = nn.LayerNorm(width)
        self.mlp = PortedMLP(width)

    def forward(self, x: Tensor, real: Tensor, cache: LayerCache, key_mask: KeyMask) -> Tensor:
        x = x + self.attn(self.ln_1(x), real, cache, key_mask)
        return x + self.mlp(self.ln_2(x))


class PortedPlainDecoder(PlainDecoder):
    """:class:`PlainDecoder` under GPT-2's names; its cache and serving methods are inherited."""

    def __init__(
        self, vocab_size: int = 64, width: int = 32, heads: int = 2, layers: int = 2, max_length: int = 64
    ) -> None:
        nn.Module.__init__(self)
        self.wte = nn.Embedding(vocab_size, width)
        self.wpe = nn.Embedding(max_length, width)
        self.h = nn.ModuleList(PortedBlock(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab_size, bias=False)
        self.maskcheck_capabilities = plain_capabilities(vocab_size, max_length, layers)

    def _run(self, ids: Tensor, new: Tensor, cache: PlainCache, key_mask: KeyMask) -> tuple[Tensor, PlainCache]:
        x = self.wte(ids) + self.wpe(advance_positions(new, cache))  # [B, n, C]
        for block, layer_cache in zip(self.h, cache.layers):
            x = block(x, new, layer_cache, key_mask)
        return self.lm_head(self.ln_f(x)), cache


class TrainingForwardIgnoresPadding(PortedPlainDecoder):
    """The port with a training-only fast path that forgets the padding mask (every token
    real), as a kernel chosen for training can: in eval mode it is the original."""

    def prefill(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, cache: PlainCache | None = None
    ) -> tuple[Tensor, PlainCache]:
        return super().prefill(input_ids, None if self.training else attention_mask, cache)


class StraightThroughAttention(PortedAttention):
    """Attention whose forward is masked and whose backward is not: the probabilities are
    ``p_unmasked + (p_masked - p_unmasked).detach()``, as a fused kernel whose backward
    recomputes the probabilities without the mask. Every forward equals the original's up
    to rounding (a masked key's weight is exactly 0); gradients reach masked keys."""

    def probabilities(self, scores: Tensor, allowed: Tensor) -> Tensor:
        unmasked = scores.softmax(dim=-1)
        masked = super().probabilities(scores, allowed)
        return unmasked + (masked - unmasked).detach()  # masked's values, unmasked's gradient


class BackwardIgnoresMask(PortedPlainDecoder):
    """The port with :class:`StraightThroughAttention` in every block: its forwards, cached
    or not, are the original's; its backward reaches future and padded tokens."""

    def __init__(self) -> None:
        super().__init__()
        for block in self.h:
            block.attn.__class__ = StraightThroughAttention


#: the original's module names -> the port's (``N``: a layer's index)
RENAMED = {
    "embed": "wte",
    "position": "wpe",
    "layers.N.norm1": "h.N.ln_1",
    "layers.N.qkv": "h.N.attn.c_attn",
    "layers.N.out": "h.N.attn.c_proj",
    "layers.N.norm2": "h.N.ln_2",
    "layers.N.mlp.0": "h.N.mlp.c_fc",
    "layers.N.mlp.2": "h.N.mlp.c_proj",
    "norm": "ln_f",
    "head": "lm_head",
}


def port_key(name: str) -> str:
    """A state-dict key of :class:`PlainDecoder` as the port names it (``layers.1.qkv.weight``
    is ``h.1.attn.c_attn.weight``); KeyError for a key the port has no place for."""
    module, _, tensor = name.rpartition(".")
    layer = re.fullmatch(r"layers\.(\d+)\.(.+)", module)
    if layer is None:
        return f"{RENAMED[module]}.{tensor}"
    index, inner = layer.groups()
    return f"{RENAMED['layers.N.' + inner].replace('N', index)}.{tensor}"


def ported_plain_decoder(seed: int = 1) -> PortedPlainDecoder:
    """The port, seeded apart from the original so that only loaded weights can make them agree."""
    torch.manual_seed(seed)
    return PortedPlainDecoder().eval()


def ported_plain_decoder_training_ignores_padding(seed: int = 1) -> TrainingForwardIgnoresPadding:
    """The port whose training forward ignores the padding mask (a seeded divergence for compare)."""
    torch.manual_seed(seed)
    return TrainingForwardIgnoresPadding().eval()


def ported_plain_decoder_backward_ignores_mask(seed: int = 1) -> BackwardIgnoresMask:
    """The port whose backward ignores the attention mask (a seeded divergence for compare)."""
    torch.manual_seed(seed)
    return BackwardIgnoresMask().eval()
