"""The variants of a Hugging Face causal LM that the same weights fit, for norm_checkpoint's behaviour evidence.

A checkpoint put under the wrong variant of its architecture runs and quietly computes
something else. The variants tried, each built one at a time around the same tensors
(``load_state_dict(assign=True)``: a variant allocates no second copy of the weights):

- sibling classes whose parameter names are exactly the model's (Llama, Mistral, Gemma,
  Granite ... share names but differ in norm offset, embedding scale, activation,
  multipliers). Each keeps the model's widths, norm epsilon and rope parameters and takes
  everything else from its own defaults: what makes it that class.
- the same class with another ``rope_theta`` (the values checkpoints commonly use);
- the same class without its final norm.

Classes whose parameter names differ (OLMo-2's extra norms, Qwen2's biases) cannot load the
weights at all: that is the ``load`` evidence's finding, not a variant.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from ...reference_models.hf_tiny import CHECKPOINT_FIELDS

#: rope_theta values checkpoints commonly use; the declared one is left out
ROPE_THETAS = (10_000.0, 500_000.0, 1_000_000.0)
#: config fields a sibling class takes from the model: its widths, and the fields that are
#: variants of their own (epsilon, rope), so that a sibling differs only in what makes it that class
KEPT_FIELDS = CHECKPOINT_FIELDS
#: where causal LMs keep their final norm, on the base model
FINAL_NORM_NAMES = ("norm", "final_layernorm", "ln_f", "final_layer_norm", "norm_f")


def rope_theta(config: Any) -> float | None:
    """The rope base of a config with plain (unscaled) rope, else None."""
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict):
        if parameters.get("rope_type", "default") != "default":
            return None
        theta = parameters.get("rope_theta")
    else:
        theta = getattr(config, "rope_theta", None)
    return float(theta) if isinstance(theta, (int, float)) else None


def final_norm(model: Any) -> tuple[Any, str] | None:
    """The module holding the final norm and its attribute name, or None."""
    base = getattr(model, "base_model", None)
    for name in FINAL_NORM_NAMES:
        if isinstance(getattr(base, name, None), torch.nn.Module) and not isinstance(
            getattr(base, name), torch.nn.Identity
        ):
            return base, name
    return None


def layout(model: Any) -> dict[str, Any]:
    """What the model runs with, among the fields its variants change."""
    fields: dict[str, Any] = {"class": type(model).__name__}
    theta = rope_theta(model.config)
    if theta is not None:
        fields["rope_theta"] = theta
    fields["final_norm"] = final_norm(model) is not None
    return fields


def variants(model: Any) -> Iterator[tuple[str, Any]]:
    """``(name, model)`` for every variant the weights fit, built one at a time."""
    state = model.state_dict()
    for class_name, model_type in sibling_classes(model):
        sibling = under_class(model, model_type, state)
        if sibling is not None:
            yield f"class={class_name}", sibling
    declared_theta = rope_theta(model.config)
    if declared_theta is not None:
        for theta in ROPE_THETAS:
            if theta != declared_theta:
                config = copy.deepcopy(model.config)
                if isinstance(getattr(config, "rope_parameters", None), dict):
                    config.rope_parameters["rope_theta"] = theta
                else:
                    config.rope_theta = theta
                rebuilt = _rebuild(type(model), config, state, model)
                if rebuilt is not None:
                    yield f"rope_theta={theta:g}", rebuilt
    if final_norm(model) is not None:
        rebuilt = _rebuild(type(model), copy.deepcopy(model.config), state, model)
        if rebuilt is not None:
            base, name = final_norm(rebuilt)  # type: ignore[misc]
            setattr(base, name, torch.nn.Identity())
            yield "final_norm=False", rebuilt


def sibling_classes(model: Any) -> list[tuple[str, str]]:
    """``(class name, model type)`` of the other causal-LM classes with exactly the model's parameter names."""
    import transformers

    from .checkpoint_fit import classes_with_parameters, tied_names

    names = set(model.state_dict()) - tied_names(model)
    type_of_class = {
        name: model_type
        for model_type, name in transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
        if isinstance(name, str)
    }
    own = type(model).__name__
    return [
        (name, type_of_class[name]) for name in classes_with_parameters(names) if name != own and name in type_of_class
    ]


def under_class(model: Any, model_type: str, state: dict[str, Any] | None = None) -> Any:
    """``model``'s weights under the causal-LM class of ``model_type`` (its widths, epsilon and
    rope kept; the rest that class's defaults), or None when they do not fit it exactly."""
    import transformers

    state = model.state_dict() if state is None else state

    declared = model.config.to_dict()
    try:
        defaults = transformers.AutoConfig.for_model(model_type).to_dict()
        config = transformers.AutoConfig.for_model(
            model_type, **{k: declared[k] for k in KEPT_FIELDS if k in declared and k in defaults}
        )
    except Exception:  # noqa: BLE001 - a sibling whose config refuses these widths is no variant
        return None
    auto = transformers.AutoModelForCausalLM
    return _rebuild(
        lambda c: auto.from_config(c, attn_implementation=model.config._attn_implementation), config, state, model
    )


def _rebuild(build: Any, config: Any, state: dict[str, Any], like: Any) -> Any:
    """A model of ``build(config)`` holding ``state``'s tensors, or None when they do not fit it
    exactly. Shapes are compared on the meta device first: a sibling whose defaults make it
    larger (a composite config's full-size text model, say) is never allocated. The model is
    built without its random initialisation (``no_init_weights``), which every weight loaded
    next replaces: drawing it cost more than the rest of the variant (2.9 s of 124M
    parameters on one core). Buffers the weights do not hold (rotary frequencies, embedding
    scales) are computed at construction, as without it."""
    try:
        with torch.device("meta"):
            shapes = {name: tuple(t.shape) for name, t in build(config).state_dict().items()}
    except Exception:  # noqa: BLE001 - a config these widths do not fit is no variant
        return None
    if shapes != {name: tuple(t.shape) for name, t in state.items()}:
        return None
    from transformers.initialization import no_init_weights

    parameter = next(like.parameters())
    try:
        with torch.device(parameter.device), no_init_weights():
            model = build(config).to(parameter.dtype)
        model.load_state_dict(state, strict=True, assign=True)
        model.eval()
        with torch.inference_mode():  # a class whose defaults cannot run at these widths is no variant
            model(input_ids=torch.tensor([[1, 2]], device=parameter.device))
    except Exception:  # noqa: BLE001 - weights that do not fit a variant, or a variant that cannot run, leave it out
        return None
    return model
