"""What a Hugging Face model declares (its attention pattern, per-layer windows and chunks) and what
calling it once shows (where its positions start, whether it returns a loss, whether its
logits have a row per token): read once, when the adapter is built."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .hf_loading import HFLoadError
from .layer_attention import LayerAttention
from .outputs import read_output

#: transformers' layer types with a pattern maskcheck verifies, and the kind each declares
LAYER_TYPES = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked"}


def declared_layers(config: Any) -> tuple[LayerAttention, ...] | None:
    """Per layer, the pattern the config declares (``layer_types``; without them, every layer
    slides when a window is declared, else every layer is chunked when a chunk is: the order
    transformers' mask builder reads them in). None where every layer is full, or where a
    layer's type is one maskcheck does not verify (linear attention, compressed attention ...)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    widths = {"full": None, "sliding": _declared_window(config), "chunked": _declared_chunk(text)}
    layers = getattr(text, "num_hidden_layers", None) or 0
    types = getattr(text, "layer_types", None)
    if not types:
        kind = "sliding" if widths["sliding"] else "chunked" if widths["chunked"] else None
        return tuple(LayerAttention(kind, widths[kind]) for _ in range(layers)) if kind and layers else None
    kinds = [LAYER_TYPES.get(kind) for kind in types]
    if any(kind is None or (kind != "full" and not widths[kind]) for kind in kinds) or set(kinds) == {"full"}:
        return None
    return tuple(LayerAttention(kind, widths[kind]) for kind in kinds)  # type: ignore[arg-type]


def unverified_layers(config: Any) -> str | None:
    """What a config declares per layer that maskcheck cannot verify, one line, or None: a
    window or a chunk beside layer types it does not know (Lara's linear attention beside
    sliding layers); their layers are then not checked one by one."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = list(dict.fromkeys(getattr(text, "layer_types", None) or []))
    unknown = [kind for kind in types if kind not in LAYER_TYPES]
    bounded = [kind for kind in types if LAYER_TYPES.get(kind) in ("sliding", "chunked")]
    if not unknown or not bounded:
        return None
    return (
        f"{', '.join(bounded)} layers not verified one by one: the config also declares {', '.join(unknown)} layers, "
        "whose pattern maskcheck does not verify"
    )


def declared_attention(config: Any, family: str) -> tuple[str, int | None]:
    """The attention pattern a config declares for the whole model: ``(pattern, width)``,
    ``width`` the window or the chunk. A pattern counts only when every layer declares it
    (:func:`declared_layers`): a single full attention layer lets influence reach back to the
    start, and the layers are then checked one by one."""
    if family == "encoder":
        return "bidirectional", None
    kinds = {(layer.kind, layer.width) for layer in declared_layers(config) or ()}
    if len(kinds) == 1:
        kind, width = kinds.pop()
        return {"sliding": "sliding_window", "chunked": "chunked"}[kind], width
    return "causal", None


def _declared_window(config: Any) -> int | None:
    """The sliding window, where the config class knows the field (a Llama config accepts
    any keyword and ignores it) and ``use_sliding_window`` does not switch it off."""
    window = getattr(config, "sliding_window", None)
    if not window or not _knows(config, "sliding_window") or getattr(config, "use_sliding_window", True) is False:
        return None
    return int(window)


def _declared_chunk(config: Any) -> int | None:
    """``attention_chunk_size``, where the config class knows the field."""
    chunk = getattr(config, "attention_chunk_size", None)
    return int(chunk) if chunk and _knows(config, "attention_chunk_size") else None


def _knows(config: Any, field: str) -> bool:
    try:
        return field in type(config)().to_dict()
    except Exception:  # some configs cannot be built without arguments
        return False


def position_offset(model: Any, task: str, vocab_size: int) -> int:
    """The position id a sequence starts at, found by calling: the offset whose ``position_ids``
    reproduce the model's own positions (0 for most; RoBERTa-style models count from
    ``padding_idx + 1``). 0 when none does (the model builds its positions otherwise)."""
    if task == "seq2seq":
        return 0
    ids = torch.tensor(
        [[3 % vocab_size, 4 % vocab_size, 5 % vocab_size, 6 % vocab_size]], device=next(model.parameters()).device
    )
    pad = getattr(model.config, "pad_token_id", None)
    candidates = dict.fromkeys([0, *([pad + 1] if isinstance(pad, int) else []), 1, 2])
    try:
        with torch.inference_mode():
            own, _ = read_output(model(input_ids=ids))
            for offset in candidates:
                positions = torch.arange(4, device=ids.device)[None] + offset
                given, _ = read_output(model(input_ids=ids, position_ids=positions))
                if torch.allclose(given, own, atol=1e-5, rtol=1e-4):
                    return offset
    except Exception:  # noqa: BLE001 - the suites will report a model that cannot take position ids
        return 0
    return 0


def check_logit_rows(model: Any, task: str, vocab_size: int) -> None:
    """The logits must have one row per predicted token. Some classes in the auto mappings
    return other shapes for text (speech LMs in the seq2seq mapping follow their own input,
    Perceiver returns a fixed number of outputs): they cannot be audited token by token, and
    saying so once beats an error in every suite."""
    device = next(model.parameters()).device
    source = torch.tensor([[3 % vocab_size, 4 % vocab_size]], device=device)
    ids = torch.tensor([[3 % vocab_size, 4 % vocab_size, 5 % vocab_size]], device=device)  # not the source's length
    inputs = {"input_ids": source, "decoder_input_ids": ids} if task == "seq2seq" else {"input_ids": ids}
    try:
        with torch.inference_mode():
            logits = model(**inputs).logits
    except Exception:  # noqa: BLE001 - a model that raises here raises in the suites, with its message
        return
    if tuple(logits.shape[:2]) != (1, 3):
        kind = "text encoder-decoder" if task == "seq2seq" else f"token-level {task} model"
        given = "decoder tokens" if task == "seq2seq" else "tokens"
        raise HFLoadError(
            f"{type(model).__name__} is not a {kind}: given 3 {given} it returns logits of shape "
            f"{list(logits.shape)}, not one row per token (speech and multimodal models need their own inputs)"
        )


def returns_loss(model: Any, task: str, vocab_size: int) -> bool:
    """Whether a forward given ``labels`` returns a loss, found by calling it once on two tokens."""
    ids = torch.tensor([[1 % vocab_size, 2 % vocab_size]], device=next(model.parameters()).device)
    labels = torch.zeros_like(ids) if task == "token-classification" else ids  # a tagger's labels are label indices
    inputs: dict[str, Any] = {"input_ids": ids, "labels": labels}
    if task == "seq2seq":
        inputs["decoder_input_ids"] = ids
    try:
        with torch.inference_mode():
            output = model(**inputs)
    except Exception:  # a model that refuses labels takes none
        return False
    loss = getattr(output, "loss", None)
    return isinstance(loss, Tensor) and loss.numel() == 1
