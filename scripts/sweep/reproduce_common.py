"""What every plain-transformers reproduction of scripts/sweep/reproduce_finding.py shares: the
model the sweep audited, rebuilt from its recorded config, its log-probabilities, and the
float32/float64 bars that tell a finding from rounding (reproduce_finding.py's docstring).
Torch and transformers only: no maskcheck."""

from __future__ import annotations

import functools
import inspect
import json
import math
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "architectures.jsonl"


def build(model_type: str, task: str, implementation: str, results: Path) -> torch.nn.Module:
    import transformers

    from maskcheck.reference_models.hf_tiny import auto_class

    record = next(
        (
            r
            for r in map(json.loads, results.read_text().splitlines())
            if (r["type"], r["task"]) == (model_type, task) and "config" in r
        ),
        None,
    )
    if record is None:
        raise SystemExit(
            f"{model_type} ({task}) is not in {results}: run scripts/sweep/architecture_sweep.py --types {model_type}"
        )
    # The default config with the recorded fields set on it, as the sweep shrank it (some shrunk
    # configs, XLNet's d_head say, would not pass the constructor's validation).
    config = transformers.AutoConfig.for_model(model_type)
    set_fields(config, record["config"])
    if task == "seq2seq":
        # Labels are shifted into decoder inputs behind these ids (EncoderDecoderModel sets
        # neither); maskcheck passed decoder inputs itself, so the decoder's own ids reproduce it.
        decoder = config.get_text_config(decoder=True)
        for key, fallback in (
            ("decoder_start_token_id", getattr(decoder, "bos_token_id", None) or 1),
            ("pad_token_id", getattr(decoder, "pad_token_id", None) or 0),
        ):
            if getattr(config, key, None) is None:
                setattr(config, key, fallback)
    torch.manual_seed(0)
    kwargs = {} if implementation == "default" else {"attn_implementation": implementation}
    return auto_class(task).from_config(config, **kwargs).eval()


def set_fields(config: object, recorded: dict) -> None:
    """The recorded fields set on ``config``; a nested config (an encoder-decoder's encoder and
    decoder, a multimodal model's text config) is recorded as a dict and set field by field.
    Fields the sweep left at their defaults are left alone: setting some validates them
    against the shrunk ones (NeoMME's per-layer config names layers a shrunk model lacks)."""
    import transformers

    defaults = json.loads(json.dumps(config.to_dict(), default=str))  # as the record holds them
    for key, value in recorded.items():
        if key in ("model_type", "transformers_version") or defaults.get(key) == value:
            continue
        nested = config_value(config, key)
        if isinstance(nested, transformers.PretrainedConfig) and isinstance(value, dict):
            set_fields(nested, value)
        else:
            setattr(config, key, value)


def config_value(config: object, key: str) -> object:
    """``config.key``, or None where it is missing or varies per layer (a heterogeneous
    config such as NeoMME's refuses a global read of a per-layer attribute)."""
    try:
        return getattr(config, key, None)
    except Exception:  # noqa: BLE001 - transformers' AmbiguousGlobalPerLayerAttributeError, or another refusal
        return None


def vocab_size(model: torch.nn.Module) -> int:
    """The size of the vocabulary the model predicts (an encoder-decoder's is its decoder's)."""
    head = model.get_output_embeddings()
    if head is not None:
        return head.weight.shape[0]
    return model.config.get_text_config(decoder=True).vocab_size


def log_probs(model: torch.nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return F.log_softmax(model(**inputs).logits.double(), dim=-1)


SOURCE_SEED = 3


def predicted(
    model: torch.nn.Module, row: torch.Tensor, mask: torch.Tensor | None = None, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """Log-probabilities over ``row`` on the side the model predicts: an encoder-decoder gets
    ``row`` as its decoder input (with a fixed source of 5 tokens), a decoder or an encoder as
    its input."""
    if model.config.is_encoder_decoder:
        inputs = {"input_ids": ids(model, 5, seed=SOURCE_SEED).expand(row.shape[0], -1), "decoder_input_ids": row}
        if mask is not None:
            inputs["decoder_attention_mask"] = mask
        return log_probs(model, **inputs)
    inputs = {"input_ids": row}
    if mask is not None:
        inputs["attention_mask"] = mask
    if positions is not None and takes(model, "position_ids"):
        inputs["position_ids"] = positions
    return log_probs(model, **inputs)


@functools.cache
def first_position(model: torch.nn.Module) -> int:
    """The position id the model gives a sequence's first token, measured by calling: the offset
    whose ``position_ids`` reproduce a call without them (RoBERTa-style models count from
    ``padding_idx + 1``). 0 for a model that takes no position ids or that none reproduces."""
    if model.config.is_encoder_decoder or not takes(model, "position_ids"):
        return 0
    row = ids(model, 4)
    own = log_probs(model, input_ids=row)
    pad = getattr(model.config, "pad_token_id", None)
    for offset in dict.fromkeys([0, *([pad + 1] if isinstance(pad, int) else []), 1, 2]):
        if torch.allclose(log_probs(model, input_ids=row, position_ids=torch.arange(4)[None] + offset), own, atol=1e-6):
            return offset
    return 0


def position_ids(model: torch.nn.Module, values: list[int]) -> torch.Tensor:
    """``values`` (0 = a sequence's first token) as the model's own position ids: [1, len]."""
    return torch.tensor([values]) + first_position(model)


def takes(model: torch.nn.Module, name: str) -> bool:
    parameters = inspect.signature(type(model).forward).parameters
    return name in parameters


#: A comparison across shapes (a padded row against the row alone, a cache against none)
#: rounds differently on each side, so it is a finding only beyond rounding. In float32 that
#: is a difference above 1e-4: about 800 units of float32 rounding (2**-23 each) at the size
#: of a log-probability, where maskcheck's measured worst is 1.5 (harness/engine/tolerance.py).
#: In float64 rounding shrinks 2**29-fold, but a model may still round some steps in
#: float32 (normalisations that upcast and cast back): 1e-5 stays 5x above the worst such
#: rounding at a log-probability of 10.
BARS = {torch.float32: 1e-4, torch.float64: 1e-5}


def beyond_rounding(difference: float, model: torch.nn.Module) -> bool:
    """Whether a difference between two computations of other shapes is more than rounding,
    for the precision the model runs in."""
    return difference > BARS[next(model.parameters()).dtype]


def remeasured_in_float64(
    model: torch.nn.Module, check: Callable[[torch.nn.Module, str], tuple[float, bool]], task: str, in_float32: float
) -> tuple[float, bool] | None:
    """A difference measured in float32 between zero and the float32 bar, measured again with
    the model in float64, whichever way the float32 check decided: rounding error shrinks
    2**29-fold there, a behaviour does not depend on the precision. A finding when the
    float64 check finds one and the difference has kept at least half its float32 size
    (a same-shape leak check finds any difference; mixture-of-experts layers reorder their
    sums with the batch, 1e-7 in float32, 1e-16 in float64). None (after saying why) when
    the model does not run in float64, or not to a finite result: the float32 result stands."""
    print(
        f"{in_float32:.3g} lies between zero and the float32 bar ({BARS[torch.float32]:g}): measuring again in float64, where rounding shrinks 2**29-fold"
    )
    try:
        difference, finding = check(model.to(torch.float64), task)
    except Exception as exc:  # noqa: BLE001 - some models build float32 tensors of their own (XLNet, Mixtral's grouped matmul)
        print(
            f"the model does not run in float64 ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}): the float32 result stands"
        )
        return None
    if not math.isfinite(difference):  # some models' masks overflow in float64 (Beam's eager attention)
        print(f"in float64 the check measures {difference}: it cannot decide, the float32 result stands")
        return None
    kept = difference >= in_float32 / 2
    finding = finding and kept
    reason = (
        "a behaviour: it kept its size"
        if finding
        else (
            "rounding: it shrank with the precision" if not kept else f"below the float64 bar ({BARS[torch.float64]:g})"
        )
    )
    print(f"in float64: {difference:.3g} against {in_float32:.3g} in float32: {reason}")
    return difference, finding


def finds_a_difference(suite: str, task: str) -> bool:
    """Whether the check's finding is a difference (every check but two: ``reach`` finds
    influence that stops, a masked LM's ``causal`` an encoder that does not read ahead)."""
    return suite != "reach" and not (suite == "causal" and task == "masked-lm")


def ids(model: torch.nn.Module, length: int, seed: int = 0) -> torch.Tensor:
    vocab = vocab_size(model)
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))
