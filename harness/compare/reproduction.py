"""Where two implementations part, as a reproduction that fails on its own.

A folder ``repro-compare-<suite>-<check>/`` holding

- ``parting.json``: how A and B are rebuilt (their specs, recorded as an audit bundle
  records a model), the weights B was given, the parting call of the check's smallest case
  as its operations in order (a forward, or a prefill and the decode steps and serving
  operations after it), the positions compared, what compare measured and its tolerance;
- ``inputs.safetensors``: every tensor of those operations;
- ``test_repro_compare.py``: a pytest file that rebuilds A and B, makes the call on both
  and fails with the measured difference and threshold when B parts from A.

The replay judges the call as compare did: log-probabilities at the compared positions,
under the shape-change rule at the floor A's own repeat of the call measures; a backward,
by the positions both gradients reach (``gradients.py``).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..adapters.base import Adapter, Batch
from ..adapters.memo import forward_memo
from ..adapters.paths import CANONICAL, PATHS
from ..engine.cases import log_probabilities
from ..engine.tolerance import Tolerance, compare_logits
from ..report.reproduction import (
    BundleError,
    adapter_for_replay,
    model_record,
    parameters_hash,
    write_folder_atomically,
)
from .gradients import compare_reach
from .layers import FirstDifference
from .paired import Operation, Parting, replay
from .weights import load_weights

PARTING_FILE = "parting.json"
INPUTS_FILE = "inputs.safetensors"
TEST_FILE = "test_repro_compare.py"


def bundle_name(suite: str, check: str) -> str:
    return f"repro-compare-{suite}-{check}"


def write_parting(
    directory: Path,
    suite: str,
    check: str,
    parting: Parting,
    a: Adapter,
    b: Adapter,
    tolerance: Tolerance,
    dtype: str,
    weights: Any,
    located: FirstDifference | None,
) -> Path:
    """Write the bundle of ``parting`` atomically; raises :class:`BundleError` (one line) where
    it could not be replayed on its own (a key mapping given as a function)."""
    from safetensors.torch import save_file

    if callable(weights):
        raise BundleError("B was given A's weights under a key mapping that is a function, which no file can hold")
    tensors: dict[str, Tensor] = {}
    data = {
        "suite": suite,
        "check": check,
        "a": model_record(a),
        "b": {**model_record(b), "parameters_sha256": parameters_hash(b)},  # after A's weights were loaded
        "device": a.capabilities.device,
        "dtype": dtype,
        "weights": None if weights is False else ("same" if weights is True else dict(weights)),
        "what": parting.what,
        "path": parting.path,
        "kind": parting.kind,
        "operations": [_encoded_operation(i, op, tensors) for i, op in enumerate(parting.history)],
        "where": _tensor("where", parting.where, tensors),
        "offset": parting.offset,
        "recorded": {"max_diff": parting.max_diff, "floor": parting.floor, "threshold": parting.threshold},
        "first_module": None if located is None else located.describe(),
        "tolerance": dataclasses.asdict(tolerance),
    }

    def fill(staging: Path) -> None:
        (staging / PARTING_FILE).write_text(json.dumps(data, indent=2) + "\n")
        save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(staging / INPUTS_FILE))
        (staging / TEST_FILE).write_text(test_source(data))

    return write_folder_atomically(directory, fill)


def _tensor(key: str, value: Tensor, tensors: dict[str, Tensor]) -> dict[str, str]:
    tensors[key] = value.detach()
    return {"tensor": key}


def _encoded(key: str, value: Any, tensors: dict[str, Tensor]) -> dict[str, Any]:
    """One argument of an operation as JSON, its tensors under names starting with ``key``."""
    if isinstance(value, Batch):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return {
            "batch": {
                name: None if field is None else _tensor(f"{key}.{name}", field, tensors)["tensor"]
                for name, field in fields.items()
            }
        }
    if isinstance(value, Tensor):
        return _tensor(key, value, tensors)
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"value": value}
    raise BundleError(f"an operation's argument of type {type(value).__name__} cannot be written to a file")


def _encoded_operation(index: int, operation: Operation, tensors: dict[str, Tensor]) -> dict[str, Any]:
    name, arguments = operation
    return {"name": name, "arguments": [_encoded(f"op{index}.{j}", v, tensors) for j, v in enumerate(arguments)]}


def _decoded(argument: dict[str, Any], tensors: dict[str, Tensor], device: str) -> Any:
    if "batch" in argument:
        return Batch(**{k: None if v is None else tensors[v].to(device) for k, v in argument["batch"].items()})
    if "tensor" in argument:
        return tensors[argument["tensor"]].to(device)
    return argument["value"]


@dataclass
class PartingReplay:
    status: str  # pass or fail
    message: str
    max_diff: float
    threshold: float
    notes: list[str]

    def report(self) -> str:
        return "\n".join([f"{self.status.upper()}: {self.message}", *self.notes])


def load_parting(path: str | Path) -> dict[str, Any]:
    folder = Path(path)
    folder = folder.parent if folder.name == PARTING_FILE else folder
    try:
        return {**json.loads((folder / PARTING_FILE).read_text()), "folder": str(folder)}
    except (OSError, ValueError) as exc:
        raise BundleError(f"{folder} is not a compare reproduction ({PARTING_FILE}: {exc})") from None


def replay_models(
    path: str | Path, a: Any = None, b: Any = None, device: str | None = None
) -> tuple[Adapter, Adapter, list[str]]:
    """A and B rebuilt from the bundle (or ``a``/``b``: models or specs), B given A's weights
    as compare gave them; and notes on weights that differ from those compare ran on."""
    data = load_parting(path)
    device = device or str(data.get("device", "cpu")).split(":")[0]
    common = {"device": device, "dtype": data.get("dtype")}
    first = adapter_for_replay({**common, "model": data["a"]}, a, device)
    second = adapter_for_replay({**common, "model": data["b"]}, b, device)
    notes = [note for note in (getattr(first, "replay_note", None),) if note]
    path = PATHS[data.get("path", CANONICAL.name)]
    if path != CANONICAL:
        first, second = first.on_path(path), second.on_path(path)
    mapping = data.get("weights")
    if mapping is not None:
        load_weights(first.model, second.model, None if mapping == "same" else mapping)
    recorded = data["b"].get("parameters_sha256")
    if recorded and parameters_hash(second) != recorded:
        notes.append("note: B's weights differ from those compare ran on")
    return first, second, notes


def replay_parting(
    path: str | Path, a: Any = None, b: Any = None, device: str | None = None, models: tuple | None = None
) -> PartingReplay:
    """Make the recorded call on A and B (``models``: :func:`replay_models`' answer, else
    rebuilt from ``a``, ``b`` and the bundle) and judge it as compare did."""
    from safetensors.torch import load_file

    data = load_parting(path)
    first, second, notes = models if models is not None else replay_models(path, a, b, device)
    device = first.capabilities.device
    tensors = load_file(str(Path(data["folder"]) / INPUTS_FILE))
    history = [
        (op["name"], tuple(_decoded(arg, tensors, device) for arg in op["arguments"])) for op in data["operations"]
    ]
    if data.get("kind") == "gradients":
        return _replay_backward(data, first, second, history, notes)
    where = tensors[data["where"]["tensor"]].bool()
    with forward_memo(False), torch.inference_mode():
        a_logits, b_logits, again = replay(first, history), replay(second, history), replay(first, history)
    normalise = log_probabilities(first)
    comparison = compare_logits(a_logits.float(), b_logits.to(a_logits.device).float(), where, normalise)
    floor = compare_logits(a_logits.float(), again.to(a_logits.device).float(), where, normalise).max_diff
    tolerance = Tolerance(**data["tolerance"])
    threshold = tolerance.shape_change(floor, data["dtype"], comparison.scale)
    said = f"max |d {comparison.quantity}| = {comparison.max_diff:.3g}, threshold {threshold:.3g} (floor {floor:.3g})"
    parts = comparison.max_diff > threshold
    positions = [[r, t + data["offset"]] for r, t in comparison.positions_over(threshold)] if parts else []
    return _judged(data, parts, said, positions, comparison.max_diff, threshold, notes, "B agrees with A")


def _replay_backward(
    data: dict[str, Any], first: Adapter, second: Adapter, history: list[Operation], notes: list[str]
) -> PartingReplay:
    """A backward's parting judged again: the positions both gradients reach (gradients.py)."""
    with forward_memo(False):
        a_norms, b_norms = (replay(side, history, kind="gradients") for side in (first, second))
    reach = compare_reach(a_norms, b_norms, Tolerance(**data["tolerance"]), data["dtype"])
    said = f"gradient norm {reach.max_diff:.3g}, threshold {reach.threshold:.3g} (noise floor 0)"
    if reach.parts:
        said = f"{reach.how}: {said}"
    agrees = "B's backward reaches the positions A's does"
    return _judged(data, reach.parts, said, reach.positions, reach.max_diff, reach.threshold, notes, agrees)


def _judged(
    data: dict[str, Any],
    parts: bool,
    said: str,
    positions: list[list[int]],
    max_diff: float,
    threshold: float,
    notes: list[str],
    agrees: str,
) -> PartingReplay:
    """The replay's verdict: a failure where the two part at ``positions`` (``said``: what
    was measured), with what compare recorded and the first differing module it named."""
    recorded = data["recorded"]
    said += f"; recorded {recorded['max_diff']:.3g} > {recorded['threshold']:.3g}"
    if not parts:
        return PartingReplay("pass", f"{agrees} in {data['what']}: {said}", max_diff, threshold, notes)
    message = f"B parts from A in {data['what']}: {said}, at [row, position] {positions[:8]}"
    if data.get("first_module"):
        message += f"; {data['first_module']}"
    return PartingReplay("fail", message, max_diff, threshold, notes)


def test_source(data: dict[str, Any]) -> str:
    suite, check = data["suite"], data["check"]
    rebuildable = all(data[side]["spec"] for side in ("a", "b"))
    models = (
        "A = B = None  # None: rebuilt from the specs recorded in parting.json\n"
        if rebuildable
        else "# parting.json cannot rebuild both models by itself: set A and B to them, e.g.\n"
        "# from mypkg.models import reference, port; A, B = reference(), port()\nA = B = None\n"
    )
    return f'''"""Where B parts from A: maskcheck compare, {suite}/{check}, its smallest case.

A: {data["a"]["spec"] or "a model object"}
B: {data["b"]["spec"] or "a model object"}
The call: {data["what"]}

Run it with plain pytest, from any directory:  pytest {TEST_FILE}
It rebuilds both models, makes the call on each and fails while B parts from A.
"""

from pathlib import Path

import pytest

from maskcheck.harness.compare.reproduction import replay_models, replay_parting

BUNDLE = Path(__file__).resolve().parent
{models}

@pytest.fixture(scope="module")
def models():
    try:
        return replay_models(BUNDLE, A, B)
    except Exception as exc:  # the setup's error, never the test's failure
        pytest.fail(f"cannot rebuild the two models: {{exc}}", pytrace=False)


def test_b_agrees_with_a(models) -> None:
    result = replay_parting(BUNDLE, models=models)
    if result.status == "fail":
        pytest.fail(result.report(), pytrace=False)
'''
