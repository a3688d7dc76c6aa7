"""Spec strings -> adapters.

| spec | meaning |
|---|---|
| ``ref:PRESET`` | a reference preset (a name: no ``/``, no ``.safetensors``) |
| ``ref:kv-retrieval`` | a checkpoint shipped with maskcheck (``reference_models.SHIPPED``) |
| ``ref:PATH`` | a reference checkpoint |
| ``mutant:NAME`` | a seeded bug from ``maskcheck.reference_models.mutants`` |
| ``hf:DIR`` | a Hugging Face directory (config.json + safetensors) |
| ``module:pkg.mod:factory`` | a factory returning a PreTrainedModel, an nn.Module or an adapter |
| ``onnx:PATH`` | an exported ONNX graph, run by ONNX Runtime (``maskcheck[onnx]``) |

Every problem is a :class:`SpecError` with a one-line message.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCHEMES = ("ref", "mutant", "hf", "module", "onnx")
DTYPES = ("float32", "bfloat16", "float16")


class SpecError(Exception):
    """A spec that cannot be resolved to a model; the message is one line for the user."""


@dataclass(frozen=True)
class LoadOptions:
    device: str = "cpu"
    dtype: str | None = None  # None: keep the model's own dtype
    task: str | None = None
    attn_implementation: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    trust_remote_code: bool = False
    allow_pickle: bool = False  # load .bin/.pt weights with torch.load(weights_only=True)
    device_map: Any = None  # hf: accelerate's placement ("auto", or a dict) for checkpoints larger than one device


@dataclass(frozen=True)
class ParsedSpec:
    scheme: str
    target: str

    def __str__(self) -> str:
        return f"{self.scheme}:{self.target}"


def parse_spec(spec: str) -> ParsedSpec:
    if not isinstance(spec, str) or ":" not in spec:
        raise SpecError(f"invalid model spec {spec!r}: expected SCHEME:TARGET with SCHEME one of {', '.join(SCHEMES)}")
    scheme, target = spec.split(":", 1)
    if scheme not in SCHEMES:
        raise SpecError(f"unknown spec scheme {scheme!r} in {spec!r}: expected one of {', '.join(SCHEMES)}")
    if not target.strip():
        raise SpecError(f"empty target in spec {spec!r}")
    if scheme == "module" and target.count(":") != 1:
        raise SpecError(f"module spec {spec!r} must look like module:package.module:factory")
    return ParsedSpec(scheme, target)


def is_reference_path(target: str) -> bool:
    return "/" in target or target.endswith(".safetensors")


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SpecError("--device cuda was asked for, but torch sees no CUDA device")
    return device


def torch_dtype(name: str | None) -> Any:
    import torch

    if name is None:
        return None
    if name not in DTYPES:
        raise SpecError(f"unknown dtype {name!r}: choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def load_adapter(spec: str, options: LoadOptions | None = None) -> Any:
    """Resolve ``spec`` to an adapter on the requested device and dtype."""
    options = options or LoadOptions()
    parsed = parse_spec(spec)
    device = resolve_device(options.device)
    dtype = torch_dtype(options.dtype)
    loaders = {
        "ref": _load_reference,
        "mutant": _load_mutant,
        "hf": _load_hf,
        "module": _load_module,
        "onnx": _load_onnx,
    }
    loader = loaders[parsed.scheme]
    adapter = loader(parsed.target, options, device, dtype)
    adapter.spec = str(parsed)
    adapter.load_options = options  # a reproduction bundle records how the spec was loaded
    return adapter


def adapter_for(
    model: Any, spec: str = "<object>", *, device: str | None = None, dtype: Any = None, task: str | None = None
) -> Any:
    """Wrap a model object in the adapter that fits its type."""
    from .base import Adapter

    if isinstance(model, Adapter):
        return model
    if isinstance(model, Path) and model.suffix == ".onnx":  # an exported graph's file
        return _load_onnx(str(model), LoadOptions(), device or "cpu", dtype)
    from ...reference_models import Transformer

    if isinstance(model, Transformer):
        from .reference import ReferenceAdapter

        return ReferenceAdapter(_place(model, device, dtype), spec)
    if _is_pretrained(model):
        from .hf import HFAdapter
        from .hf_loading import HFLoadError

        try:
            return HFAdapter(_place(model, device, dtype), spec, task=task)
        except HFLoadError as exc:
            raise SpecError(str(exc)) from None
    from .sentence_transformers_models import is_sentence_transformer

    if is_sentence_transformer(model):  # its forward takes a features dict: called as a plain module
        from .sentence_transformers_models import SentenceTransformerCall

        try:
            model = SentenceTransformerCall(model)
        except ValueError as exc:
            raise SpecError(f"{spec}: {exc}") from None
    capabilities = getattr(model, "maskcheck_capabilities", None)
    if isinstance(capabilities, dict):
        from .base import Capabilities

        capabilities = Capabilities(**capabilities)
    from .torchtune_models import is_torchtune_decoder

    if is_torchtune_decoder(model):
        from .torchtune_models import TorchtuneAdapter

        try:  # what it is is read off the module; a declaration, where there is one, is used instead
            return TorchtuneAdapter(model, capabilities, loss_fn=getattr(model, "maskcheck_loss", None), spec=spec)
        except ValueError as exc:
            raise SpecError(f"{spec}: {exc}") from None
    if capabilities is not None:
        from .module import ModuleAdapter

        try:
            return ModuleAdapter(
                model,
                capabilities,
                mask_convention=getattr(model, "maskcheck_mask_convention", None),  # None: measured
                mask_keyword=getattr(model, "maskcheck_mask_keyword", None),  # None: found by name
                loss_fn=getattr(model, "maskcheck_loss", None),
                spec=spec,
                output_kind=getattr(model, "maskcheck_output_kind", None),  # None: measured
                output_name=getattr(model, "maskcheck_output_name", None),  # None: read by name
                prefix_keyword=getattr(model, "maskcheck_prefix_keyword", None),  # a prefix LM's
                prefix_form=getattr(model, "maskcheck_prefix_form", "mask"),
            )
        except ValueError as exc:  # a declaration the module contradicts, or a polarity it does not show
            raise SpecError(f"{spec}: {exc}") from None
    raise SpecError(
        f"{spec}: got a {type(model).__name__}; expected a transformers PreTrainedModel, a sentence-transformers "
        "SentenceTransformer, a reference Transformer, an Adapter, or an nn.Module with a maskcheck_capabilities attribute"
    )


def _place(model: Any, device: str | None, dtype: Any) -> Any:
    if device is not None or dtype is not None:
        model = model.to(device=device, dtype=dtype)
    return model


def _is_pretrained(model: Any) -> bool:
    """A transformers model, or a PeftModel wrapping one (the HF adapter audits what it runs)."""
    if "transformers" not in sys.modules:
        return False
    from transformers import PreTrainedModel

    from .peft_models import is_peft_model

    return isinstance(model, PreTrainedModel) or is_peft_model(model)


def _load_reference(target: str, options: LoadOptions, device: str, dtype: Any) -> Any:
    from ...reference_models import (
        PRESETS,
        SHIPPED,
        CheckpointError,
        Transformer,
        load_checkpoint,
        read_config,
    )
    from .reference import checkpoint_record, trained_length

    if target in SHIPPED:
        target = str(SHIPPED[target])
    if not is_reference_path(target):
        if target not in PRESETS:
            raise SpecError(f"unknown reference preset {target!r}; known: {', '.join(sorted(PRESETS))}")
        import torch

        config = override_config(PRESETS[target], options.overrides) if options.overrides else PRESETS[target]
        torch.manual_seed(0)  # a preset is a fixed random-init model, the same in every process
        return adapter_for(Transformer(config), f"ref:{target}", device=device, dtype=dtype)
    if Path(target).suffix in PICKLE_SUFFIXES:
        return adapter_for(_reference_pickle(target, options), f"ref:{target}", device=device, dtype=dtype)
    try:
        saved = read_config(target)
        config = override_config(saved, options.overrides) if options.overrides else saved
        # An override forces another layout, the way a wrong conversion script would; the
        # norm_checkpoint suite then reports it against what the checkpoint recorded.
        model = load_checkpoint(target, config, allow_mismatch=bool(options.overrides))
        record = checkpoint_record(os.path.abspath(target), saved)
    except (CheckpointError, ValueError, TypeError) as exc:
        raise SpecError(str(exc)) from None
    adapter = adapter_for(model, f"ref:{target}", device=device, dtype=dtype)
    adapter.checkpoint = record
    adapter.capabilities = dataclasses.replace(adapter.capabilities, trained_length=trained_length(record))
    return adapter


PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


def _reference_pickle(target: str, options: LoadOptions) -> Any:
    """A reference model from a torch.save'd ``{"config": {...}, "state_dict": {...}}``, only with --allow-pickle."""
    from ...reference_models import ModelConfig, Transformer
    from .base import PickleRefused, load_tensors_only

    if not options.allow_pickle:
        raise SpecError(
            f"{target} is a pickle checkpoint: unpickling can run code, so it is refused; pass --allow-pickle to load it "
            "with torch.load(weights_only=True), which restores tensors only (or convert it to safetensors)"
        )
    if not Path(target).is_file():
        raise SpecError(f"no checkpoint file at {target}")
    try:
        data = load_tensors_only(target)
    except PickleRefused as exc:
        raise SpecError(str(exc)) from None
    if (
        not isinstance(data, dict)
        or not isinstance(data.get("config"), dict)
        or not isinstance(data.get("state_dict"), dict)
    ):
        raise SpecError(f"{target} is not a reference checkpoint (expected a dict with 'config' and 'state_dict')")
    try:
        config = ModelConfig.from_dict(data["config"])
        config = override_config(config, options.overrides) if options.overrides else config
        model = Transformer(config)
        model.load_state_dict(data["state_dict"])
    except (ValueError, TypeError, RuntimeError) as exc:
        raise SpecError(f"{target}: {str(exc).splitlines()[0]}") from None
    return model.eval()


def override_config(config: Any, overrides: dict[str, Any]) -> Any:
    """``config`` with fields replaced; string values (from a command line) are coerced to the field's type."""
    fields = {f.name: f for f in dataclasses.fields(config)}
    changes: dict[str, Any] = {}
    for key, value in overrides.items():
        if key not in fields:
            raise SpecError(f"unknown override {key!r}; reference config fields: {', '.join(fields)}")
        changes[key] = _coerce(value, getattr(config, key))
    try:
        return config.replace(**changes)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def _coerce(value: Any, current: Any) -> Any:
    if not isinstance(value, str):
        return value
    if isinstance(current, bool):
        if value.lower() not in ("true", "false", "1", "0"):
            raise SpecError(f"expected true or false, got {value!r}")
        return value.lower() in ("true", "1")
    if isinstance(current, int) or (current is None and value.isdigit()):
        return None if value.lower() == "none" else int(value)
    if isinstance(current, float):
        return float(value)
    return value


def _load_onnx(target: str, options: LoadOptions, device: str, dtype: Any) -> Any:
    """An exported graph, as it is: its dtype is the graph's, and it runs on ONNX Runtime's CPU provider."""
    from .onnx_models import OnnxAdapter, OnnxLoadError

    if device != "cpu":
        raise SpecError(
            f"onnx:{target}: an ONNX graph runs on ONNX Runtime's CPU provider here: drop --device {device}"
        )
    try:
        adapter = OnnxAdapter(target, f"onnx:{target}")
    except OnnxLoadError as exc:
        raise SpecError(str(exc)) from None
    asked = None if dtype is None else str(dtype).removeprefix("torch.")
    if asked is not None and asked != adapter.capabilities.dtype:
        raise SpecError(
            f"onnx:{target}: the graph computes in {adapter.capabilities.dtype}, as exported: drop --dtype {asked}"
        )
    return adapter


def _load_mutant(target: str, options: LoadOptions, device: str, dtype: Any) -> Any:
    from ...reference_models import mutants

    try:
        model = mutants.build(target)
    except KeyError as exc:
        raise SpecError(str(exc.args[0])) from None
    except ImportError as exc:  # a seeded bug in an optional test subject (torchtune)
        raise SpecError(f"mutant:{target}: {exc}") from None
    return adapter_for(model, f"mutant:{target}", device=device, dtype=dtype)


def _load_hf(target: str, options: LoadOptions, device: str, dtype: Any) -> Any:
    from .hf import HFAdapter
    from .hf_loading import HFLoadError, load_hf_directory, load_hf_tokenizer

    try:
        model = load_hf_directory(
            target,
            task=options.task,
            dtype=dtype,
            device=device,
            attn_implementation=options.attn_implementation,
            trust_remote_code=options.trust_remote_code,
            allow_pickle=options.allow_pickle,
            device_map=options.device_map,
        )
        return HFAdapter(
            model,
            f"hf:{os.path.abspath(target)}",
            task=options.task,
            tokenizer=load_hf_tokenizer(target, options.trust_remote_code),
        )
    except HFLoadError as exc:  # loading, or what the adapter measures on the loaded model
        raise SpecError(str(exc)) from None


def factory_spec(factory: Any) -> str | None:
    """``module:pkg.mod:name`` for a factory importable under that name, else None
    (a lambda, a closure, a method, or a function of ``__main__``)."""
    module_name, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    if not module_name or module_name == "__main__" or not name.isidentifier():
        return None
    try:
        found = getattr(importlib.import_module(module_name), name, None)
    except Exception:  # noqa: BLE001 - any failure means "not importable by name"
        return None
    return f"module:{module_name}:{name}" if found is factory else None


def import_root(spec: str) -> str | None:
    """For a loaded ``module:pkg.mod:factory`` spec, the directory that makes ``pkg.mod``
    importable (what replay puts on sys.path, from any working directory)."""
    module_name = spec.split(":")[1] if spec.startswith("module:") and spec.count(":") == 2 else ""
    file = getattr(sys.modules.get(module_name), "__file__", None)
    if not file:
        return None
    path = Path(file).resolve()
    root = path.parent.parent if path.name == "__init__.py" else path.parent
    for _ in module_name.split(".")[1:]:
        root = root.parent
    return str(root)


def call_factory(target: str, scheme: str = "module") -> Any:
    """Import ``pkg.mod:factory`` (the current directory first on the path, so a factory
    beside the user's code works without installing) and return what calling it returns."""
    module_name, _, factory_name = target.partition(":")
    if not all(part.isidentifier() for part in module_name.split(".")) or not factory_name.isidentifier():
        raise SpecError(
            f"{scheme} spec '{scheme}:{target}' must look like {scheme}:package.module:factory (Python names)"
        )
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SpecError(f"cannot import {module_name!r}: {exc}") from None
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise SpecError(f"{module_name} has no callable {factory_name!r}")
    try:
        return factory()
    except Exception as exc:
        raise SpecError(f"the factory {target} raised {type(exc).__name__}: {exc}") from None


def _load_module(target: str, options: LoadOptions, device: str, dtype: Any) -> Any:
    model = call_factory(target)
    return adapter_for(model, f"module:{target}", device=device, dtype=dtype, task=options.task)
