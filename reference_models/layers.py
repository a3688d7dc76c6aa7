"""Building blocks: norms, position schemes, attention and the feed-forward layer."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig


class RMSNorm(nn.Module):
    """RMSNorm; with ``unit_offset`` the stored weight w is applied as ``(1 + w)``."""

    def __init__(self, dim: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        scale = 1.0 + self.weight if self.unit_offset else self.weight
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(x.dtype) * scale


def make_norm(config: ModelConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return RMSNorm(config.d_model, config.norm_eps, config.norm_unit_offset)
    return nn.LayerNorm(config.d_model, eps=config.norm_eps)


def sinusoidal_table(length: int, dim: int) -> Tensor:
    """The fixed sin/cos table of "Attention is all you need", for any ``dim`` (odd too).

    Even columns hold sines, odd columns cosines; an odd ``dim`` has one more sine
    column than cosine columns.
    """
    position = torch.arange(length, dtype=torch.float64)[:, None]  # [L, 1]
    frequency = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))  # [ceil(D/2)]
    angles = position * frequency  # [L, ceil(D/2)]
    table = torch.zeros(length, dim, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles[:, : dim // 2])
    return table.float()


def rotary_cos_sin(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos and sin for rotary embeddings at ``positions [B, T]``, each ``[B, 1, T, head_dim]``."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    angles = positions.float()[..., None] * inv_freq  # [B, T, head_dim / 2]
    angles = torch.cat([angles, angles], dim=-1)[:, None]  # [B, 1, T, head_dim]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x [B, H, T, Dh]`` by the angles in ``cos``/``sin`` (half-split convention)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


def alibi_slopes(n_heads: int) -> Tensor:
    """Per-head ALiBi slopes, the geometric sequence of Press et al. (any head count)."""
    closest = 2 ** math.floor(math.log2(n_heads))
    base = [2 ** (-8 * (i + 1) / closest) for i in range(closest)]
    extra = [2 ** (-4 * (2 * i + 1) / closest) for i in range(n_heads - closest)]
    return torch.tensor(base + extra)


def alibi_bias(slopes: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
    """ALiBi bias ``[B, H, Tq, Tk]`` from position ids, so padding does not shift distances."""
    distance = (q_positions[:, :, None] - k_positions[:, None, :]).abs()  # [B, Tq, Tk]
    return -slopes.to(q_positions.device)[None, :, None, None] * distance[:, None].float()


class Attention(nn.Module):
    """Multi-head attention with MHA / GQA / MQA key-value heads.

    The mask passed to :meth:`forward` is bool ``[B, Tq, Tk]`` with True = may attend
    (see :mod:`maskcheck.reference_models.masks`). A query that may attend to nothing (a padded
    slot under left padding) gets a uniform average instead of NaN; its output is
    never read by a real position.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.n_heads
        self.n_kv_heads = config.kv_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.d_model, config.n_heads * config.head_dim)
        self.k_proj = nn.Linear(config.d_model, config.kv_heads * config.head_dim)
        self.v_proj = nn.Linear(config.d_model, config.kv_heads * config.head_dim)
        self.o_proj = nn.Linear(config.n_heads * config.head_dim, config.d_model)

    def project_kv(self, source: Tensor) -> tuple[Tensor, Tensor]:
        batch, length, _ = source.shape
        k = self.k_proj(source).view(batch, length, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, Tk, Dh]
        v = self.v_proj(source).view(batch, length, self.n_kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, Tk, Dh]
        return k, v

    def forward(
        self,
        x: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor,
        rotary: tuple[Tensor, Tensor] | None = None,
        bias: Tensor | None = None,
    ) -> Tensor:
        batch, length, _ = x.shape
        if mask.dtype != torch.bool or mask.dim() != 3:
            raise TypeError(
                f"attention mask must be bool [B, Tq, Tk] with True = attend, got {mask.dtype} {list(mask.shape)}"
            )
        q = self.q_proj(x).view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)  # [B, H, Tq, Dh]
        if rotary is not None:
            q = apply_rotary(q, *rotary)
        groups = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(groups, dim=1)  # [B, H, Tk, Dh]
        v = v.repeat_interleave(groups, dim=1)  # [B, H, Tk, Dh]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)  # [B, H, Tq, Tk]
        if bias is not None:
            scores = scores + bias.to(scores.dtype)
        scores = scores.masked_fill(~mask[:, None], torch.finfo(scores.dtype).min)
        weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        out = (weights @ v).transpose(1, 2).reshape(batch, length, self.n_heads * self.head_dim)  # [B, Tq, D]
        return self.o_proj(out)


class FeedForward(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.up = nn.Linear(config.d_model, config.ffn_dim)
        self.down = nn.Linear(config.ffn_dim, config.d_model)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.down(F.gelu(self.up(x))))
