"""What a Hugging Face model declares (its attention pattern, per-layer windows) and what
calling it once shows (where its positions start, whether it returns a loss, whether its
logits have a row per token): read once, when the adapter is built."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .hf_loading import HFLoadError
from .outputs import read_output


def declared_layer_windows(config: Any) -> list[int | None] | None:
    """Per layer, the sliding window the config declares (None: full attention); None when
    no layer declares one or a layer's type is neither (chunked attention, ...)."""
    pattern, window = declared_attention(config, "decoder", every_layer=False)
    if pattern != "sliding_window":
        return None
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = getattr(text, "num_hidden_layers", None)
    types = getattr(text, "layer_types", None) or ["sliding_attention"] * (layers or 0)
    kinds = {"sliding_attention": window, "full_attention": None}
    if not types or any(kind not in kinds for kind in types) or "sliding_attention" not in types:
        return None
    return [kinds[kind] for kind in types]


def declared_attention(config: Any, family: str, every_layer: bool = True) -> tuple[str, int | None]:
    """The attention pattern a config declares: ``(pattern, window)``.

    A ``sliding_window`` counts only when the config class knows the field (a Llama
    config accepts any keyword and ignores it), when ``use_sliding_window`` does not
    switch it off, and when every layer uses it (``layer_types``): a single full
    attention layer lets influence reach back to the start.
    """
    if family == "encoder":
        return "bidirectional", None
    window = getattr(config, "sliding_window", None)
    try:
        known = "sliding_window" in type(config)().to_dict()
    except Exception:  # some configs cannot be built without arguments
        known = False
    if not window or not known or getattr(config, "use_sliding_window", True) is False:
        return "causal", None
    layer_types = getattr(config, "layer_types", None)
    if every_layer and layer_types and any(kind != "sliding_attention" for kind in layer_types):
        return "causal", None
    return "sliding_window", int(window)


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
