"""Plain PyTorch models whose masks are right on one call path and wrong on another.

Each is what a user could write with stock PyTorch, and each is exact under
``torch.inference_mode`` (the path every check once ran on):

- :class:`WindowedMHADecoder`: ``nn.MultiheadAttention`` with a sliding-window
  ``attn_mask`` and ``is_causal=True`` as a hint. Outside the inference fast path, with
  no key padding mask and ``need_weights=False``, PyTorch takes the hint and drops the
  mask: the window is gone when the model is called without a mask with gradients on.
- :class:`WindowedEncoderDecoder`: a causal LM built from ``nn.TransformerEncoder`` with
  a sliding-window mask and ``is_causal=True``: the window holds in inference and is
  dropped with gradients on.
- :class:`BackwardLeakDecoder`: the scratch decoder with a custom autograd function on its
  embeddings that is the identity forward and carries each position's gradient into the
  next position's embedding backward.
- :func:`llama_padding_backward_leak`: a tiny Hugging Face Llama whose first layer's input
  goes through the identity forward that carries each position's gradient into the
  previous position backward: the forward isolates padded slots exactly, and only a
  left-padded row's backward reaches its padding (the slot before the first real token).

``maskcheck_capabilities`` declares what each model promises; nothing else of maskcheck is
imported.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor, nn

from .scratch import ScratchDecoder

WINDOW = 3  # a query reads itself and the 2 keys before it


#: added to the scores of blocked keys: finite, so a fully padded query row (a left-padded
#: slot whose window holds only padding) attends uniformly instead of giving NaN, whose
#: backward would poison the real positions' gradients too
BLOCKED = -1e9


def window_blocked(length: int, window: int, device: Any = None) -> Tensor:
    """``[T, T]`` True where query ``q`` may *not* read key ``k`` (PyTorch's ``attn_mask`` polarity)."""
    distance = torch.arange(length, device=device)[:, None] - torch.arange(length, device=device)[None, :]  # [T, T]
    return ~((distance >= 0) & (distance < window))


def additive(blocked: Tensor) -> Tensor:
    """A boolean "blocked" mask as the float mask added to attention scores."""
    return torch.zeros(blocked.shape, device=blocked.device).masked_fill(blocked, BLOCKED)


class WindowedMHADecoder(nn.Module):
    """One sliding-window layer of ``nn.MultiheadAttention``; ``attention_mask`` [B, T] is
    1 at real tokens and ``position_ids`` [B, T] default to ``0 .. T-1`` (both optional).
    ``is_causal_hint`` passes ``is_causal=True`` beside the window mask with ``need_weights=False``."""

    def __init__(self, is_causal_hint: bool = False, vocab_size: int = 64, width: int = 32) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.is_causal_hint = is_causal_hint
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(64, width)
        self.attention = nn.MultiheadAttention(width, 2, batch_first=True)
        self.head = nn.Linear(width, vocab_size)
        self.maskcheck_mask_convention = "keep"
        self.maskcheck_capabilities = {
            "family": "decoder",
            "vocab_size": vocab_size,
            "max_length": 64,
            "n_layers": 1,
            "attention": "sliding_window",
            "window": WINDOW,
            "takes_position_ids": True,
        }
        self.eval()

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor:
        length = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(length, device=input_ids.device)
        x = self.embed(input_ids) + self.position(position_ids)  # [B, T, C]
        ignored = None if attention_mask is None else additive(~attention_mask.bool())  # [B, T]
        with warnings.catch_warnings():  # PyTorch deprecates a float padding mask beside a boolean attn_mask
            warnings.simplefilter("ignore", UserWarning)
            attended, _ = self.attention(
                x,
                x,
                x,
                attn_mask=window_blocked(length, WINDOW, input_ids.device),
                key_padding_mask=ignored,
                need_weights=not self.is_causal_hint,
                is_causal=self.is_causal_hint,
            )
        return self.head(x + attended)  # [B, T, V]


class WindowedEncoderDecoder(nn.Module):
    """A causal LM made of ``nn.TransformerEncoder`` layers under a sliding-window mask; it
    takes no padding mask. ``is_causal_hint`` passes ``is_causal=True`` with the mask."""

    def __init__(self, is_causal_hint: bool = False, vocab_size: int = 64, width: int = 32, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.is_causal_hint = is_causal_hint
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(64, width)
        layer = nn.TransformerEncoderLayer(width, 2, 2 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab_size)
        self.maskcheck_capabilities = {
            "family": "decoder",
            "vocab_size": vocab_size,
            "max_length": 64,
            "n_layers": layers,
            "attention": "sliding_window",
            "window": WINDOW,
        }
        self.eval()

    def forward(self, input_ids: Tensor) -> Tensor:
        length = input_ids.shape[1]
        x = self.embed(input_ids) + self.position(torch.arange(length, device=input_ids.device))  # [B, T, C]
        blocked = additive(window_blocked(length, WINDOW, input_ids.device))
        return self.head(self.encoder(x, mask=blocked, is_causal=self.is_causal_hint))  # [B, T, V]


class FaintNextToken(ScratchDecoder):
    """The scratch decoder whose logits at t take in 2% of those at t + 1: a leak of a few
    hundredths in log-probability, below the bfloat16 arithmetic term (~0.08 at scale 5)."""

    def forward(self, idx: Tensor, input_pos: Tensor | None = None) -> Tensor:
        logits = super().forward(idx, input_pos)  # [B, T, V]
        leaked = logits.clone()
        leaked[:, :-1] += 0.02 * logits[:, 1:]
        return leaked


def bfloat16(model: nn.Module) -> nn.Module:
    """``model`` in bfloat16, in eval mode."""
    return model.to(torch.bfloat16).eval()


class ShiftedGradient(torch.autograd.Function):
    """The identity forward; backward, each position's gradient also flows into the input
    ``shift`` positions away: +1 into the next position (the loss at t reaches the
    embedding at t + 1, the future), -1 into the previous one (a causal dependency, but the
    slot before a row's first real token is a left-padded one, which a real output then
    reaches)."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, shift: int) -> Tensor:  # x [B, T, C]
        ctx.shift = shift
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # grad [B, T, C]
        leaked = grad.clone()
        if ctx.shift > 0:
            leaked[:, ctx.shift :] += 0.5 * grad[:, : -ctx.shift]
        else:
            leaked[:, : ctx.shift] += 0.5 * grad[:, -ctx.shift :]
        return leaked, None


def llama_padding_backward_leak(context: int = 1024) -> Any:
    """A tiny Llama of 1024 positions, exact forward, whose backward carries gradient from each
    position into the one before it: into the padding of a left-padded row, never of a
    right-padded one."""
    from .hf_bugs import tiny_hf

    model = tiny_hf("llama", "sdpa", context)
    model.model.layers[0].register_forward_pre_hook(
        lambda _layer, args: (ShiftedGradient.apply(args[0], -1), *args[1:])
    )
    return model


class BackwardLeakDecoder(ScratchDecoder):
    """The scratch decoder, exact forward, whose backward carries gradient from later tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks[0].register_forward_pre_hook(lambda _block, args: (ShiftedGradient.apply(args[0], 1), *args[1:]))
