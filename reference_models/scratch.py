"""A decoder written from scratch in the gpt-fast / nanoGPT style: no mask, a KV cache kept
in the module and addressed by the positions of the tokens fed.

It knows nothing of maskcheck beyond ``maskcheck_capabilities``::

    setup_caches(max_batch_size, max_seq_length)    # empty buffers, sized for one request
    forward(idx [B, T], input_pos [T] | None) -> logits [B, T, V]

Without ``input_pos`` the forward is the plain causal one (training, evaluation). With
it, the tokens' keys and values are written into the cache at those positions and each
token reads the cache up to itself. ``window`` makes every layer a sliding window of that
width (a query reads itself and ``window - 1`` keys back).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.keys: Tensor | None = None  # [B, H, S, D] once setup_caches ran
        self.values: Tensor | None = None

    def setup_cache(self, batch: int, length: int, width: int) -> None:
        shape = (batch, self.heads, length, width // self.heads)
        self.keys, self.values = torch.zeros(shape), torch.zeros(shape)

    def forward(self, x: Tensor, allowed: Tensor, input_pos: Tensor | None) -> Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=-1)  # each [B, T, C]
        q, k, v = (t.view(batch, length, self.heads, -1).transpose(1, 2) for t in (q, k, v))  # [B, H, T, D]
        if input_pos is not None:
            assert self.keys is not None and self.values is not None, "call setup_caches first"
            self.keys[:, :, input_pos], self.values[:, :, input_pos] = k, v
            k, v = self.keys, self.values  # [B, H, S, D]: `allowed` hides the slots not written yet
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)  # [B, H, T, D]
        return self.out(attended.transpose(1, 2).reshape(batch, length, width))  # [B, T, C]


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = Attention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: Tensor, allowed: Tensor, input_pos: Tensor | None) -> Tensor:
        x = x + self.attention(self.norm1(x), allowed, input_pos)
        return x + self.mlp(self.norm2(x))


class ScratchDecoder(nn.Module):
    def __init__(
        self,
        vocab_size: int = 64,
        width: int = 32,
        heads: int = 2,
        layers: int = 2,
        max_length: int = 64,
        window: int | None = None,
        declared_window: int | None = None,
    ) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.width, self.window = width, window
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(max_length, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        declared = declared_window if declared_window is not None else window
        self.maskcheck_capabilities = {
            "family": "decoder",
            "vocab_size": vocab_size,
            "max_length": max_length,
            "n_layers": layers,
            "has_cache": True,
            **({"attention": "sliding_window", "window": declared} if declared is not None else {}),
        }
        self.eval()

    def setup_caches(self, max_batch_size: int, max_seq_length: int) -> None:
        for block in self.blocks:
            block.attention.setup_cache(max_batch_size, max_seq_length, self.width)

    def allowed(self, queries: Tensor, keys: Tensor) -> Tensor:
        """``[Tq, Tk]`` True where query position ``q`` may read key position ``k``."""
        distance = queries[:, None] - keys[None, :]  # [Tq, Tk]
        allowed = distance >= 0
        return allowed & (distance < self.window) if self.window is not None else allowed

    def positions(self, input_pos: Tensor) -> Tensor:
        """The positions embedded for the tokens at ``input_pos`` (a hook for the seeded bug)."""
        return input_pos

    def forward(self, idx: Tensor, input_pos: Tensor | None = None) -> Tensor:
        length = idx.shape[1]
        if input_pos is None:
            queries = keys = torch.arange(length, device=idx.device)
            positions = queries
        else:
            queries = input_pos
            keys = torch.arange(self.blocks[0].attention.keys.shape[2], device=idx.device)  # type: ignore[union-attr]
            positions = self.positions(input_pos)
        return self.run(idx, positions, self.allowed(queries, keys), input_pos)

    def run(self, idx: Tensor, positions: Tensor, allowed: Tensor, input_pos: Tensor | None) -> Tensor:
        """The blocks over ``idx`` at ``positions``; ``allowed`` ([Tq, Tk], or [B, 1, Tq, Tk])
        is True where a query may read a key."""
        x = self.embed(idx) + self.position(positions)  # [B, T, C]
        for block in self.blocks:
            x = block(x, allowed, input_pos)
        return self.head(self.norm(x))  # [B, T, V]


class StepPositionOffByOne(ScratchDecoder):
    """A module-state cache whose decoding steps embed the position one past the token's own
    (the prefill, at position 0, is right): cached decoding differs from the full forward."""

    def positions(self, input_pos: Tensor) -> Tensor:
        return input_pos + 1 if int(input_pos[0]) > 0 else input_pos


class ScratchDecoderTakingMask(ScratchDecoder):
    """The scratch decoder whose plain forward also takes ``mask``: an attention matrix
    ``[B, 1, T, T]`` (True = may attend) that replaces its causal pattern, handed to SDPA as
    it is, with ``position_ids``. Its cache protocol (``setup_caches`` + ``input_pos``) takes
    no mask, so its cached rows cannot be padded."""

    def __init__(self) -> None:
        super().__init__()
        self.maskcheck_capabilities = {**self.maskcheck_capabilities, "takes_position_ids": True}

    def forward(  # type: ignore[override]
        self,
        idx: Tensor,
        input_pos: Tensor | None = None,
        mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        if mask is None or input_pos is not None:
            return super().forward(idx, input_pos)
        positions = torch.arange(idx.shape[1], device=idx.device) if position_ids is None else position_ids
        return self.run(idx, positions, mask, None)


def scratch_decoder() -> ScratchDecoder:
    return ScratchDecoder()


def scratch_with_loss(shifted: bool = True) -> ScratchDecoder:
    """A scratch decoder with a loss of its own (next-token cross-entropy over labels != -100);
    ``shifted=False`` scores each position against its own label: the answer is in the input."""
    model = ScratchDecoder()

    def loss(logits: Tensor, labels: Tensor) -> Tensor:
        if shifted:
            logits, labels = logits[:, :-1], labels[:, 1:]
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)

    model.maskcheck_loss = loss  # type: ignore[assignment]
    model.maskcheck_capabilities["has_loss"] = True
    return model
