"""Safetensors checkpoints whose metadata carries the full config.

The metadata holds ``maskcheck.format`` (an integer version), ``maskcheck.config``
(the :class:`ModelConfig` as JSON) and ``maskcheck.fingerprint``: the log-probabilities
the model gave a fixed probe batch when it was saved, so a loader can prove it runs the
same computation. Loading into a config whose architecture fields differ (norm layout,
final norm, norm kind, position scheme, ...) is refused with the fields named: the same
parameter names under another layout give a model that runs and computes something else.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from .config import ARCHITECTURE_FIELDS, ModelConfig
from .model import Transformer

FORMAT_VERSION = 1
FORMAT_KEY = "maskcheck.format"
CONFIG_KEY = "maskcheck.config"
FINGERPRINT_KEY = "maskcheck.fingerprint"
FINGERPRINT_SHAPE = (2, 12)
FINGERPRINT_COLUMNS = 512  # log-probabilities of the first ids only: the header stays small for any vocabulary


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded as asked."""


def save_checkpoint(model: Transformer, path: str | Path, extra_metadata: dict[str, str] | None = None) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {name: model.state_dict()[name].detach().contiguous().cpu() for name in _unique_names(model)}
    metadata = {
        FORMAT_KEY: str(FORMAT_VERSION),
        CONFIG_KEY: json.dumps(model.config.to_dict()),
        FINGERPRINT_KEY: json.dumps(record_fingerprint(model)),
    }
    metadata.update(extra_metadata or {})
    save_file(state, str(path), metadata=metadata)
    return path


@dataclass(frozen=True)
class Fingerprint:
    """Log-probabilities ``[B, T, C]`` of the first C ids that a model gave :func:`fingerprint_ids`."""

    logprobs: Tensor


def fingerprint_ids(config: ModelConfig) -> Tensor:
    """The fixed probe batch ``[2, 12]``: ids drawn from a fixed seed, never the pad id."""
    generator = torch.Generator().manual_seed(20240229)
    ids = torch.randint(0, config.vocab_size - 1, FINGERPRINT_SHAPE, generator=generator)
    return ids + (ids >= config.pad_token_id).long()


def fingerprint_logprobs(model: Transformer) -> Tensor:
    """What the model gives the probe batch: log-softmax over the first ids, float32 ``[B, T, C]``."""
    parameter = next(model.parameters())
    ids = fingerprint_ids(model.config).to(parameter.device)
    decoder_ids = ids if model.config.family == "encoder_decoder" else None
    with torch.inference_mode():
        logits = model(ids, decoder_input_ids=decoder_ids).logits  # [B, T, V]
    return torch.log_softmax(logits.double(), -1)[..., :FINGERPRINT_COLUMNS].float().cpu()


def record_fingerprint(model: Transformer) -> dict[str, object]:
    values = fingerprint_logprobs(model)
    return {"shape": list(values.shape), "float32": base64.b64encode(values.numpy().tobytes()).decode("ascii")}


def read_fingerprint(path: str | Path) -> Fingerprint | None:
    """The fingerprint saved with a checkpoint, or None for checkpoints written without one."""
    raw = read_metadata(path).get(FINGERPRINT_KEY)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        values = torch.frombuffer(bytearray(base64.b64decode(data["float32"])), dtype=torch.float32)
        return Fingerprint(values.reshape(data["shape"]).clone())
    except (ValueError, KeyError, RuntimeError) as exc:
        raise CheckpointError(f"{path}: unreadable {FINGERPRINT_KEY} metadata ({exc})") from None


def _unique_names(model: Transformer) -> list[str]:
    """State-dict names with shared tensors (tied or reused embeddings) listed once:
    safetensors stores each tensor once, and loading one name fills every alias."""
    seen: set[int] = set()
    names = []
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            names.append(name)
    return names


def read_metadata(path: str | Path) -> dict[str, str]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint file at {path}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            return dict(handle.metadata() or {})
    except Exception as exc:  # safetensors raises its own error types for truncated files
        raise CheckpointError(f"{path} is not a readable safetensors file ({exc})") from None


def read_config(path: str | Path) -> ModelConfig:
    metadata = read_metadata(path)
    if CONFIG_KEY not in metadata:
        raise CheckpointError(f"{path} has no {CONFIG_KEY!r} metadata: not a maskcheck reference checkpoint")
    version = int(metadata.get(FORMAT_KEY, "0"))
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path} has format version {version}; this maskcheck reads up to {FORMAT_VERSION}")
    return ModelConfig.from_dict(json.loads(metadata[CONFIG_KEY]))


def architecture_mismatch(saved: ModelConfig, wanted: ModelConfig) -> dict[str, tuple[object, object]]:
    """Fields whose values differ between the saved and the wanted config: ``{field: (saved, wanted)}``."""
    return {
        name: (getattr(saved, name), getattr(wanted, name))
        for name in ARCHITECTURE_FIELDS
        if getattr(saved, name) != getattr(wanted, name)
    }


def load_checkpoint(
    path: str | Path, config: ModelConfig | None = None, *, allow_mismatch: bool = False
) -> Transformer:
    """Build a model from ``path``; with ``config``, refuse a different architecture unless allowed.

    With ``allow_mismatch`` the weights load the way a careless conversion script would:
    parameters the other layout lacks are dropped and parameters it adds keep their
    (seeded) initialisation, so the model runs and computes something else.
    """
    saved = read_config(path)
    wanted = saved if config is None else config
    mismatch = architecture_mismatch(saved, wanted)
    if mismatch and not allow_mismatch:
        fields = ", ".join(f"{k}: saved {a!r}, asked {b!r}" for k, (a, b) in mismatch.items())
        raise CheckpointError(f"{path} was trained with another architecture ({fields}); refusing to load it")
    torch.manual_seed(0)
    model = Transformer(wanted)
    with safe_open(str(path), framework="pt") as handle:
        state = {name: handle.get_tensor(name) for name in handle.keys()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    aliases = set(model.state_dict()) - set(_unique_names(model))
    missing = [m for m in missing if m not in aliases]
    if (missing or unexpected) and not (allow_mismatch and mismatch):
        raise CheckpointError(f"{path} does not fit {wanted}: missing {missing}, unexpected {unexpected}")
    return model.eval()


def weights_hash(path: str | Path) -> str:
    """A SHA-256 of the checkpoint bytes, to tell when weights behind a spec changed."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
