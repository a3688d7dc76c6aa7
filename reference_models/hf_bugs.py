"""The seeded bugs of Hugging Face models: an attention function whose mask goes through a
bug, a cache layer, a forward that drops its mask, weights under a sibling class
(reference_models/mutants.py names each and says which check must catch it)."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import Tensor

# -- Hugging Face models with a seeded bug ----------------------------------------------------


def hf_attention(name: str, transform: Callable[[Any, Any, Any], Any]) -> str:
    """Register an SDPA attention function whose mask goes through ``transform(mask, q_len, k_len)``."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(
        module: Any, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None, **kwargs: Any
    ) -> Any:
        kwargs.pop("is_causal", None)
        mask = transform(attention_mask, query.shape[2], key.shape[2])
        return sdpa_attention_forward(
            module, query, key, value, mask, is_causal=mask is None and query.shape[2] > 1, **kwargs
        )

    AttentionInterface.register(name, attention)
    # Without a registered mask function transformers builds no mask at all for a custom name.
    AttentionMaskInterface.register(name, sdpa_mask)
    return name


def leak_next(mask: Tensor | None, q_len: int, k_len: int) -> Tensor:
    q = torch.arange(k_len - q_len, k_len)[:, None]
    k = torch.arange(k_len)[None, :]
    return (k <= q + 1)[None, None]  # [1, 1, Tq, Tk]: each query also reads the next key


def leak_next_when_padded(mask: Tensor | None, q_len: int, k_len: int) -> Tensor | None:
    # A shared mask builder with the bug on its padded path only: with nothing padded SDPA
    # gets no mask and applies is_causal (right); the mask built for a padded batch lets
    # each query read the next key. Unpadded rows never show it.
    if mask is None:
        return None
    return mask | leak_next(mask, q_len, k_len).to(mask.device)


def drop_padding(mask: Tensor | None, q_len: int, k_len: int) -> None:
    return None  # SDPA then applies is_causal only: padding is read


def top_left_causal_on_cached_chunks(mask: Tensor | None, q_len: int, k_len: int) -> Tensor | None:
    # No mask with a cache: SDPA's is_causal then aligns the triangle top-left when q_len < k_len.
    return None if 1 < q_len < k_len else mask


def no_mask_for_one_query(mask: Tensor | None, q_len: int, k_len: int) -> Tensor | None:
    # The decode fast path: one query cannot see its own future, so no mask is built; the
    # padding of a left-padded batch's cached keys goes with it.
    return None if q_len == 1 < k_len else mask


def tiny_hf(kind: str, attn_implementation: str, context: int = 64) -> Any:
    """A tiny GPT-2 or Llama with random weights, of ``context`` positions."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    torch.manual_seed(0)
    if kind == "gpt2":
        config = GPT2Config(
            vocab_size=96, n_embd=32, n_layer=2, n_head=4, n_positions=context, bos_token_id=1, eos_token_id=2
        )
    else:
        config = LlamaConfig(
            vocab_size=96,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=context,
            pad_token_id=0,
        )
    return AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation).eval()


def cache_bug(layer: str) -> Any:
    """The tiny Llama whose generation cache's dynamic layers are ``serving_bugs.<layer>``."""
    from . import serving_bugs

    return serving_bugs.with_cache_layer(tiny_hf("llama", "sdpa"), getattr(serving_bugs, layer))


def mistral(window_dropped: bool) -> Any:
    """A tiny Mistral with a real-width sliding window (512 tokens); with ``window_dropped``
    its mask builder makes a plain causal mask, as a model class that forgets to build the
    sliding mask would. The window is wider than any toy-size pattern, so only a check at
    the window's own width sees it."""
    import functools
    from unittest import mock

    from transformers import MistralConfig, MistralForCausalLM
    from transformers.models.mistral import modeling_mistral

    class WindowDroppedMistral(MistralForCausalLM):
        @functools.wraps(MistralForCausalLM.forward)
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            with mock.patch.object(
                modeling_mistral, "create_sliding_window_causal_mask", modeling_mistral.create_causal_mask
            ):
                return super().forward(*args, **kwargs)

    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        sliding_window=512,
        pad_token_id=0,
    )
    cls = WindowDroppedMistral if window_dropped else MistralForCausalLM
    return cls(config).eval()


def logits_shifted_with_cache(model: Any) -> Any:
    """``model`` (in place) with a forward that adds a ramp over the vocabulary to its logits
    whenever ``use_cache`` is asked for: the same model without a cache, another with one."""
    forward = model.forward

    @functools.wraps(forward)  # generate() reads the forward's signature
    def cache_shifted(*args: Any, **kwargs: Any) -> Any:
        output = forward(*args, **kwargs)
        if kwargs.get("use_cache"):
            output.logits = output.logits + torch.linspace(0, 1, output.logits.shape[-1])
        return output

    model.forward = cache_shifted
    return model


def shipped_hf(name: str, as_type: str | None = None) -> Any:
    """A shipped Hugging Face checkpoint; with ``as_type``, its weights under that type's class
    (the layout mismatch a hand-written config makes)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from .hf_tiny import CHECKPOINT_FIELDS
    from .shipped import SHIPPED_HF

    model = AutoModelForCausalLM.from_pretrained(str(SHIPPED_HF[name]), use_safetensors=True)
    if as_type is None:
        return model.eval()
    declared, defaults = model.config.to_dict(), AutoConfig.for_model(as_type).to_dict()
    config = AutoConfig.for_model(
        as_type, **{k: declared[k] for k in CHECKPOINT_FIELDS if k in declared and k in defaults}
    )
    mismatched = AutoModelForCausalLM.from_config(config, attn_implementation=model.config._attn_implementation)
    mismatched.load_state_dict(model.state_dict(), strict=True)  # the shipped checkpoints fit both classes
    return mismatched.eval()


def llama_mask_dropped() -> Any:
    """A tiny Llama whose forward drops the attention mask it is given. With use_cache=False
    and position ids derived from the mask, transformers reads the restarting positions as
    packed sequences and isolates the padded slots, so the drop looks exact; with the cache
    at its default (as users call it) nothing isolates them."""
    model = tiny_hf("llama", "sdpa")
    model.__class__ = mask_dropping(type(model))
    return model


def mask_dropping(cls: type) -> type:
    @functools.wraps(cls.forward)
    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        kwargs["attention_mask"] = None
        return cls.forward(self, *args, **kwargs)

    return type(f"MaskDropping{cls.__name__}", (cls,), {"forward": forward})
