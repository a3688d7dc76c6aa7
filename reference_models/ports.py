"""Seeded divergences for ``maskcheck compare``: a tiny Llama or Mistral and a port of it that parts somewhere.

Each divergence is a mistake people make porting a model (one computation done another
way); B holds A's weights, so wherever compare finds them parting, the divergence put it
there. The GQA port's attention is registered with transformers' own ``AttentionInterface``
(its masks built as for ``eager``), so B stays a ``LlamaForCausalLM`` and only that one
function differs. Clean pairs: ``eager`` against ``sdpa``, and a model against itself saved
and loaded again (``saved_and_loaded``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .hf_tiny import tiny_model

#: the attention functions the ports register with transformers' AttentionInterface
TILED_HEADS_ATTENTION = "maskcheck_gqa_repeat"
INPUT_DTYPE_SOFTMAX_ATTENTION = "maskcheck_input_dtype_softmax"


def attention_with(heads: Callable[[Any, int], Any], softmax: Callable[[Any], Any]) -> Callable:
    """transformers' eager attention (for ``AttentionInterface``) with how key/value heads are
    repeated for the query heads (``heads(kv, groups)``) and the softmax of the scores given."""

    def attention(
        module: Any,
        query: Any,  # [B, H, T, d]
        key: Any,  # [B, H_kv, S, d]
        value: Any,
        attention_mask: Any,  # additive, [B, 1, T, >= S]: 0 where a query may read a key
        scaling: float,
        dropout: float = 0.0,
        **_: Any,
    ) -> Any:
        groups = module.num_key_value_groups
        key, value = heads(key, groups), heads(value, groups)  # [B, H_kv, S, d] -> [B, H, S, d]
        weights = torch.matmul(query, key.transpose(2, 3)) * scaling  # [B, H, T, S]
        if attention_mask is not None:
            weights = weights + attention_mask[:, :, :, : key.shape[-2]]
        weights = softmax(weights).to(query.dtype)
        out = torch.matmul(weights, value).transpose(1, 2).contiguous()  # [B, T, H, d]
        return out, weights

    return attention


def repeat_kv(kv: Any, groups: int) -> Any:
    """transformers' own ``repeat_kv``: query head h reads key/value head h // groups."""
    from transformers.models.llama.modeling_llama import repeat_kv as transformers_repeat_kv

    return transformers_repeat_kv(kv, groups)


def _tiled(kv: Any, groups: int) -> Any:
    """The GQA port's mistake: ``repeat``, so query head h reads key/value head h % H_kv."""
    return kv.repeat(1, groups, 1, 1)


def _input_dtype_softmax(weights: Any) -> Any:
    """The softmax port's: taken in the scores' own dtype, where eager asks for float32."""
    return torch.softmax(weights, dim=-1)


def float32_softmax(weights: Any) -> Any:
    """transformers' eager softmax: computed in float32 whatever the scores' dtype."""
    return torch.softmax(weights, dim=-1, dtype=torch.float32)


def _eps_outside_sqrt(norm: Any, hidden: torch.Tensor) -> torch.Tensor:  # [B, T, D]
    """``x / (sqrt(mean(x^2)) + eps)``: the port's RMSNorm forward; Llama's is ``x / sqrt(mean(x^2) + eps)``."""
    x = hidden.float()
    normed = x / (x.pow(2).mean(-1, keepdim=True).sqrt() + norm.variance_epsilon)
    return norm.weight * normed.to(hidden.dtype)


def _rotated_backwards(
    attention: Any, hidden_states: torch.Tensor, position_embeddings: Any, *args: Any, **kwargs: Any
):
    """The port's attention: rotary's ``rotate_half`` negates the wrong half, ``(x2, -x1)`` where
    Llama's is ``(-x2, x1)``, so every query and key turns backwards. ``q cos + (x2, -x1) sin``
    is ``q cos + (-x2, x1)(-sin)`` bit for bit (a product's sign is exact), so the port is
    Llama's attention given ``-sin``: the rotary module's outputs are Llama's, and the
    difference starts inside each attention."""
    cos, sin = position_embeddings  # [B, T, d] each
    return type(attention).__mro__[1].forward(attention, hidden_states, (cos, -sin), *args, **kwargs)


def ported(divergence: str, attn_implementation: str = "eager", seed: int = 0) -> tuple[Any, Any]:
    """(A, B): a tiny model and the port of it with ``divergence`` (one of :data:`DIVERGENCES`
    or :data:`ROUNDING_PORTS`), A's weights in B."""
    known = {**DIVERGENCES, **ROUNDING_PORTS}
    if divergence not in known:
        raise KeyError(f"unknown divergence {divergence!r}; known: {', '.join(known)}")
    base, port = known[divergence]
    a = tiny_model(base, attn_implementation, seed=seed)
    b = port(seed)
    b.load_state_dict(a.state_dict())
    return a, b.eval()


def llama_with_attention(name: str, attention: Callable, seed: int = 0) -> Any:
    """The tiny Llama (4 heads over 2 key/value heads) computing attention with ``attention``,
    registered under ``name``, its masks built as for eager."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, eager_mask)
    return tiny_model("llama", name, seed=seed)


def _with_tiled_heads(seed: int) -> Any:
    return llama_with_attention(TILED_HEADS_ATTENTION, attention_with(_tiled, float32_softmax), seed)


def _with_input_dtype_softmax(seed: int) -> Any:
    return llama_with_attention(INPUT_DTYPE_SOFTMAX_ATTENTION, attention_with(repeat_kv, _input_dtype_softmax), seed)


def _without_window(seed: int) -> Any:
    """The tiny Mistral (window 4) with no window: a kernel swap that ignores ``sliding_window``."""
    import transformers

    from .hf_tiny import tiny_config

    config = tiny_config("mistral")
    config.sliding_window = None
    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def _with_forward(seed: int, module_class: str, port_name: str, forward: Callable) -> Any:
    """The tiny Llama whose every ``module_class`` module (of ``modeling_llama``) runs ``forward``,
    through a subclass named ``port_name``: one computation ported, everything else Llama's."""
    from transformers.models.llama import modeling_llama

    original = getattr(modeling_llama, module_class)
    port = type(port_name, (original,), {"forward": forward})
    model = tiny_model("llama", "eager", seed=seed)
    for module in model.modules():
        if type(module) is original:
            module.__class__ = port
    return model


def _with_norm(seed: int) -> Any:
    return _with_forward(seed, "LlamaRMSNorm", "LlamaRMSNormEpsOutsideSqrt", _eps_outside_sqrt)


def _with_rotary_backwards(seed: int) -> Any:
    return _with_forward(seed, "LlamaAttention", "LlamaAttentionRotaryWrongHalf", _rotated_backwards)


#: divergence -> (A's tiny model, how B is built; B is then given A's weights)
DIVERGENCES: dict[str, tuple[str, Callable[[int], Any]]] = {
    "rotary_wrong_half": ("llama", _with_rotary_backwards),
    "gqa_repeat_not_interleave": ("llama", _with_tiled_heads),
    "rms_norm_eps_outside_sqrt": ("llama", _with_norm),
    "sliding_window_dropped": ("mistral", _without_window),
}


#: ports that compute one function another way within rounding: compare must let them pass.
#: ``torch.softmax`` of bfloat16 or float16 scores is bit for bit the float32 softmax cast
#: back on torch's CPU kernels (scripts/softmax_input_dtype.py), so the port that skips
#: eager's float32 is no divergence there (docs/compare.md).
ROUNDING_PORTS: dict[str, tuple[str, Callable[[int], Any]]] = {
    "softmax_in_input_dtype": ("llama", _with_input_dtype_softmax),
}


def saved_and_loaded(model: Any, directory: str) -> Any:
    """``model`` after ``save_pretrained`` to ``directory`` and ``from_pretrained`` back (safetensors)."""
    import transformers

    model.save_pretrained(directory)
    return transformers.AutoModelForCausalLM.from_pretrained(directory).eval()


def llama() -> Any:
    """The tiny Llama the ports start from (a factory for ``module:`` specs)."""
    return tiny_model("llama", "eager")


def gqa_repeat_llama() -> Any:
    """Its port that repeats key/value heads with ``repeat`` (a factory for ``module:`` specs)."""
    return ported("gqa_repeat_not_interleave")[1]


def mistral() -> Any:
    """The tiny Mistral, window 4 (a factory for ``module:`` specs)."""
    return tiny_model("mistral", "eager")


def windowless_mistral() -> Any:
    """Its port that drops the sliding window (a factory for ``module:`` specs)."""
    return ported("sliding_window_dropped")[1]


def rotary_wrong_half_llama() -> Any:
    """Its port whose rotary negates the wrong half (a factory for ``module:`` specs)."""
    return ported("rotary_wrong_half")[1]
