"""Loading a Hugging Face checkpoint directory safely, and telling its task.

safetensors only by default; pickle weights only when asked, read by maskcheck with
``torch.load(weights_only=True)``; no ``trust_remote_code`` unless the caller asks.
"""

from __future__ import annotations

import functools
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
from torch import Tensor

from ...reference_models.hf_tiny import auto_class
from .base import PickleRefused, load_tensors_only
from .task_names import TASKS

Task = Literal[
    "causal-lm", "masked-lm", "seq2seq", "sequence-classification", "token-classification", "feature-extraction"
]
#: the family a language-model task tells
FAMILY_OF_TASK = {"causal-lm": "decoder", "masked-lm": "encoder", "seq2seq": "encoder_decoder"}


class HFLoadError(Exception):
    """A Hugging Face directory that cannot be loaded safely or at all."""


@dataclass(frozen=True)
class LoadingInfo:
    """What ``from_pretrained`` did with a checkpoint's tensors (tied weights already understood)."""

    checkpoint: str
    missing: tuple[str, ...]  # parameters the checkpoint did not hold: initialised at random
    unexpected: tuple[str, ...]  # tensors of the checkpoint the class never reads
    mismatched: tuple[str, ...]  # tensors whose shape does not fit the parameter


#: class-name endings of the heads whose task the name tells (an encoder-decoder is told by its config)
MASKED_LM_HEADS = ("ForMaskedLM", "ForPreTraining")
CAUSAL_LM_HEADS = ("ForCausalLM", "LMHeadModel")
CLASSIFIER_HEADS = {
    "ForSequenceClassification": "sequence-classification",
    "ForTokenClassification": "token-classification",
}
#: heads whose inputs are not one row of tokens per example (choices, question spans): refused by name
UNAUDITED_HEADS = ("ForMultipleChoice", "ForQuestionAnswering", "ForNextSentencePrediction")
#: model types whose config, saved without a head's name, is a masked LM when it says it is no decoder
BERT_FAMILY = ("bert", "roberta", "distilbert", "albert", "electra")


def infer_task(config: Any, class_names: Sequence[str] = ()) -> Task:
    """The task of a model, by one rule whether it was handed in as an object (its class's
    name) or is read from a directory (the config's ``architectures``):

    - a classifier head's class name (``...ForSequenceClassification``,
      ``...ForTokenClassification``): that classification task, whatever the family;
    - else a config that says it is an encoder-decoder: ``seq2seq``;
    - else the first class name whose head tells the task (``...ForMaskedLM`` and
      ``...ForPreTraining``: ``masked-lm``; ``...ForCausalLM`` and ``...LMHeadModel``: ``causal-lm``;
      a base model class of transformers' ``AutoModel`` mapping, ``BertModel``: ``feature-extraction``);
    - else a BERT-family config that says it is no decoder: ``masked-lm``;
    - else ``causal-lm``.

    A head whose inputs are not one row of tokens (multiple choice, question answering) is an
    :class:`HFLoadError`: loading it as another class would audit a model it is not.
    """
    names = list(class_names) or list(getattr(config, "architectures", None) or [])
    for name in names:
        if name.endswith(UNAUDITED_HEADS):
            raise HFLoadError(
                f"{name} takes inputs other than one row of tokens per example, which maskcheck does not audit; "
                f"--task names the class to load instead ({', '.join(TASKS)})"
            )
        head = next((task for ending, task in CLASSIFIER_HEADS.items() if name.endswith(ending)), None)
        if head is not None:
            return head  # type: ignore[return-value]
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    for name in names:
        if name.endswith(MASKED_LM_HEADS):
            return "masked-lm"
        if name.endswith(CAUSAL_LM_HEADS):
            return "causal-lm"
        if name in _base_model_classes():
            return "feature-extraction"
    if getattr(config, "is_decoder", True) is False and getattr(config, "model_type", "") in BERT_FAMILY:
        return "masked-lm"
    return "causal-lm"


@functools.lru_cache(maxsize=1)
def _base_model_classes() -> frozenset[str]:
    """The class names of transformers' base models (``AutoModel``'s mapping: ``BertModel``, ``LlamaModel``)."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    names: set[str] = set()
    for value in MODEL_MAPPING_NAMES.values():
        names.update([value] if isinstance(value, str) else value)
    return frozenset(names)


def family_of(config: Any, task: str, model: Any = None) -> str:
    """The family a model of ``task`` belongs to: a language-model task tells it; a classifier
    or a base model is what its attention modules declare (transformers' ``is_causal``: any
    causal self-attention makes a decoder, as the text model under an audio encoder), else an
    encoder where its type has a masked LM and its config says it is no decoder (BERT,
    RoBERTa), a decoder where its type has a causal LM (GPT-2, Llama), else an encoder. An
    encoder-decoder's classifier is an :class:`HFLoadError` of one line."""
    if task in FAMILY_OF_TASK:
        return FAMILY_OF_TASK[task]
    # An encoder-decoder's config can sit under an encoder-only head (UMT5's token classifier):
    # the head is an encoder-decoder's where its forward takes decoder inputs.
    takes_decoder_inputs = model is None or "decoder_input_ids" in inspect.signature(type(model).forward).parameters
    if getattr(config, "is_encoder_decoder", False) and takes_decoder_inputs:
        raise HFLoadError(
            f"{task} of an encoder-decoder ({getattr(config, 'model_type', '?')}) is not audited yet: its head "
            "builds decoder inputs of its own"
        )
    declared = [
        flag
        for module in (model.modules() if model is not None else ())
        if type(module).__name__.endswith("Attention") and isinstance(flag := getattr(module, "is_causal", None), bool)
    ]
    if declared:
        return "decoder" if any(declared) else "encoder"
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", "")
    if model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        return "encoder"
    return "decoder" if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else "encoder"


def load_hf_directory(
    directory: str | Path,
    *,
    task: str | None = None,
    dtype: torch.dtype | None = None,
    device: str | None = None,
    attn_implementation: str | None = None,
    trust_remote_code: bool = False,
    allow_pickle: bool = False,
    device_map: Any = None,
) -> Any:
    """Build a model from a local directory of config.json + safetensors (sharded or not).

    With ``allow_pickle`` and no safetensors, ``*.bin``/``*.pt`` weights are read with
    ``torch.load(weights_only=True)`` by maskcheck itself (not left to the library's default).
    """
    import transformers

    path = Path(directory)
    if not path.exists():
        raise HFLoadError(f"no such directory: {path}")
    if not path.is_dir():
        raise HFLoadError(f"{path} is not a directory (hf: expects a directory with config.json and safetensors)")
    if not (path / "config.json").is_file():
        raise HFLoadError(f"{path} has no config.json")
    pickles = sorted(path.glob("*.bin")) + sorted(path.glob("*.pt"))
    has_safetensors = bool(list(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").is_file())
    if not has_safetensors and not pickles:
        raise HFLoadError(f"{path} has no safetensors weights")
    if not has_safetensors and not allow_pickle:
        raise HFLoadError(
            f"{path} has only pickle weights ({', '.join(p.name for p in pickles)}): unpickling can run code, "
            "so they are refused; pass --allow-pickle to load them with torch.load(weights_only=True), "
            "which restores tensors only"
        )
    try:
        raw = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise HFLoadError(f"{path / 'config.json'} is not valid JSON ({exc})") from None
    if raw.get("auto_map") and not trust_remote_code:
        raise HFLoadError(
            f"{path} needs custom code from the checkpoint (auto_map in config.json); "
            "maskcheck runs no checkpoint code unless you pass --trust-remote-code"
        )
    try:
        config = transformers.AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (ValueError, KeyError) as exc:
        raise HFLoadError(f"{path}: unsupported or unknown architecture ({str(exc).splitlines()[0]})") from None
    chosen: Task = task if task is not None else infer_task(config)  # type: ignore[assignment]
    if chosen not in TASKS:
        raise HFLoadError(f"unknown task {chosen!r}; choose one of {', '.join(TASKS)}")
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if dtype is not None:
        kwargs["dtype"] = dtype
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if device_map is not None:
        try:
            import accelerate  # noqa: F401
        except ImportError:
            raise HFLoadError("--device-map needs accelerate: pip install 'maskcheck[sharding]'") from None
        kwargs["device_map"] = device_map
        if isinstance(device_map, dict) and "disk" in device_map.values():
            kwargs["offload_folder"] = str(path / ".maskcheck-offload")
        device = None  # accelerate places every module itself
    if not has_safetensors:
        model = _from_pickles(auto_class(chosen), config, pickles, kwargs)
        return model.to(device) if device is not None else model
    try:
        model, info = auto_class(chosen).from_pretrained(
            str(path), use_safetensors=True, output_loading_info=True, **kwargs
        )
    except ValueError as exc:
        raise HFLoadError(f"{path}: cannot build a {chosen} model ({str(exc).splitlines()[0]})") from None
    except Exception as exc:  # OSError, or the safetensors reader's own error for a truncated file
        raise HFLoadError(
            f"{path}: cannot read the weights ({type(exc).__name__}: {str(exc).splitlines()[0]})"
        ) from None
    if device is not None:
        model = model.to(device)
    mismatched = tuple(
        str(entry[0] if isinstance(entry, (tuple, list)) else entry) for entry in info.get("mismatched_keys", ())
    )
    model.maskcheck_loading_info = LoadingInfo(
        str(path),
        tuple(sorted(info.get("missing_keys", ()))),
        tuple(sorted(info.get("unexpected_keys", ()))),
        mismatched,
    )
    return model


def load_hf_tokenizer(directory: str | Path, trust_remote_code: bool = False) -> Any:
    """The directory's tokenizer (tokenizer.json and its config), or None when it has none.

    Only the probes need it; a tokenizer that cannot be built leaves the suites running."""
    path = Path(directory)
    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
        return None
    import transformers

    try:
        return transformers.AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except Exception:  # pragma: no cover - an unusual tokenizer is not a reason to stop an audit
        return None


def _from_pickles(auto_class: Any, config: Any, files: list[Path], kwargs: dict[str, Any]) -> Any:
    """A model from its config, its weights read with ``torch.load(weights_only=True)``."""
    state: dict[str, Any] = {}
    for file in files:
        try:
            loaded = load_tensors_only(file)
        except PickleRefused as exc:
            raise HFLoadError(str(exc)) from None
        if not isinstance(loaded, dict) or not all(isinstance(v, Tensor) for v in loaded.values()):
            raise HFLoadError(f"{file} is not a state dict of tensors")
        state.update(loaded)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("trust_remote_code", "device_map", "offload_folder")}
    model = auto_class.from_config(config, **kwargs)
    missing, _ = model.load_state_dict(state, strict=False)
    # A tied parameter (lm_head = embeddings) is filled through its twin.
    parameters = dict(model.named_parameters(remove_duplicate=False))
    loaded = {id(parameters[name]) for name in state if name in parameters}
    missing = [name for name in missing if id(parameters.get(name)) not in loaded]
    if missing:
        raise HFLoadError(f"the pickle weights lack {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    return model.eval()
