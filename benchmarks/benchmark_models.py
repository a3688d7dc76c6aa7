"""The models the benchmarks time and count, built from configs with random weights.

``gpt2_small`` has the 124M-parameter shape (768 wide, 12 layers, 50257 tokens); the peer's
zero-code run builds it from this function's source (``versus_peer.peer_module``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch


def gpt2_small() -> Any:
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(bos_token_id=1, eos_token_id=2, pad_token_id=0)  # the 124M shape
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def gpt2_shape(width: int, layers: int, heads: int, positions: int = 1024) -> Any:
    """A random-init GPT-2 with GPT-2's vocabulary, ``positions`` of context and the given size."""
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        n_embd=width,
        n_layer=layers,
        n_head=heads,
        n_positions=positions,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def gpt2_narrow() -> Any:
    """GPT-2 with the 124M shape's vocabulary and context but 64 wide and one layer: the
    audit draws the cases it draws on gpt2-small (their lengths follow the context) at a
    fiftieth of the compute, for counting forwards and tokens (``--count``)."""
    return gpt2_shape(64, 1, 4)


def tiny_reference() -> Any:
    from maskcheck.reference_models import PRESETS, Transformer

    torch.manual_seed(0)
    return Transformer(PRESETS["tiny-decoder"]).eval()


MODELS: dict[str, Callable[[], Any]] = {"gpt2-small": gpt2_small, "tiny-reference": tiny_reference}
COUNTED: dict[str, Callable[[], Any]] = {**MODELS, "gpt2-narrow": gpt2_narrow}
