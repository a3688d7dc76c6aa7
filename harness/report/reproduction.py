"""Reproduction bundles: a failing check as plain data, its inputs, and a standalone test.

A bundle is a directory ``repro-<suite>/`` holding

- ``case.json``: the model (spec with absolute paths, a hash of its weights), the seed,
  profile, dtype, device, tolerance, and per failing check the shrunk case (with its type,
  so it can be rebuilt), the measured outcome and Hypothesis's ``@reproduce_failure`` blob
  (printed for the curious; it is not stable across Hypothesis versions and replay never
  uses it);
- ``inputs.safetensors``: every tensor the model received while the case was replayed;
- ``test_repro_<suite>.py``: a pytest file that rebuilds the model, replays each case with
  nothing but maskcheck installed, and fails with the same message.

Bundles are written to a temporary directory and renamed into place, so they are
complete or absent.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.base import Adapter, Batch
from ..adapters.memo import DecodesThroughOwnCalls
from ..adapters.paths import CANONICAL, PATHS
from ..engine.suite import Outcome, RunContext
from ..engine.tolerance import Tolerance

#: 2: maskcheck 0.2 moved every module under the maskcheck namespace (case types read
#: ``maskcheck.suites.padding:PaddedCase``); format 1 bundles are read by renaming them.
BUNDLE_FORMAT = 2
READABLE_FORMATS = (1, 2)
CASE_FILE = "case.json"
INPUTS_FILE = "inputs.safetensors"


class BundleError(Exception):
    """A bundle that cannot be read or replayed; the message is one line for the user."""


# -- recording the inputs of one case -----------------------------------------------------------


class RecordingAdapter(DecodesThroughOwnCalls):
    """Wraps an adapter and keeps every batch and token tensor passed to it, in call order."""

    def __init__(self, adapter: Adapter, tensors: dict[str, Any] | None = None) -> None:
        self._adapter = adapter
        self.tensors: dict[str, Any] = {} if tensors is None else tensors

    def __getattr__(self, name: str) -> Any:
        return getattr(self._adapter, name)

    def packing_settings(self) -> list:
        # The settings' adapters run the packed cases: record through them too.
        return [
            (setting, RecordingAdapter(adapter, self.tensors)) for setting, adapter in self._adapter.packing_settings()
        ]

    def _keep(self, call: str, batch: Batch | None = None, **tensors: Any) -> None:
        index = len({key.split(".")[0] for key in self.tensors})
        fields = dataclasses.asdict(batch) if batch is not None else {}
        for name, value in {**fields, **tensors}.items():
            if value is not None:
                # a copy: tensors that share memory (the same labels passed twice) cannot be saved apart
                self.tensors[f"{index:03d}_{call}.{name}"] = value.detach().cpu().clone()

    def logits(self, batch: Batch, keep: int | None = None) -> Any:
        self._keep("logits", batch)
        return self._adapter.logits(batch, keep)

    def loss(self, batch: Batch, labels: Any) -> Any:
        self._keep("loss", batch, labels=labels)
        return self._adapter.loss(batch, labels)

    def prefill(self, batch: Batch, rollback: bool = False) -> Any:
        self._keep("prefill", batch)
        return self._adapter.prefill(batch, rollback=rollback)

    def rearrange(self, state: Any, operation: str, index: Any) -> Any:
        self._keep(f"rearrange_{operation}", None, index=index)
        return self._adapter.rearrange(state, operation, index)

    def reuse(self, state: Any, batch: Batch) -> Any:
        self._keep("reuse", batch)
        return self._adapter.reuse(state, batch)

    def with_cache_implementation(self, name: str) -> "RecordingAdapter":
        return RecordingAdapter(self._adapter.with_cache_implementation(name), self.tensors)

    def step(self, state: Any, tokens: Any, attention_mask: Any = None) -> Any:
        self._keep("step", None, tokens=tokens, attention_mask=attention_mask)
        return self._adapter.step(state, tokens, attention_mask)

    def layer_attention_masks(self, input_ids: Any) -> Any:
        self._keep("layers", None, input_ids=input_ids)
        return self._adapter.layer_attention_masks(input_ids)

    def input_gradients(self, batch: Batch, outputs: Any, seed: int) -> Any:
        self._keep("gradients", batch, outputs=outputs)
        return self._adapter.input_gradients(batch, outputs, seed)

    def on_path(self, path: Any) -> "RecordingAdapter":
        return RecordingAdapter(self._adapter.on_path(path), self.tensors)


# -- identifying the model --------------------------------------------------------------------


def absolute_spec(spec: str) -> str | None:
    """The spec with an absolute path, or None for a model handed in as an object."""
    from ..adapters.specs import SpecError, parse_spec

    if not spec or " " in spec:  # a relayout ("... as norm=...") is no spec
        return None
    try:
        parse_spec(spec)
    except SpecError:  # "<object>", or a test id a pytest hook gave the model
        return None
    scheme, _, target = spec.partition(":")
    if scheme in ("hf", "ref") and ("/" in target or target.endswith(".safetensors")):
        return f"{scheme}:{os.path.abspath(target.split(' as ')[0])}"
    if scheme == "onnx":  # a graph is named by its path (and its hash, weights_hash)
        return f"onnx:{os.path.abspath(target)}"
    return spec


def weights_hash(spec: str | None) -> str | None:
    """SHA-256 over the weight files behind a path spec, an ONNX graph's file included (None
    for presets, mutants, factories)."""
    if spec is None:
        return None
    scheme, _, target = spec.partition(":")
    path = Path(target)
    if scheme not in ("hf", "ref", "onnx") or not path.exists():
        return None
    from ...reference_models import weights_hash as file_hash

    if not path.is_dir():
        return file_hash(path)
    # A sharded directory: one digest over each weight file's name and digest.
    listing = "".join(f"{file.name}:{file_hash(file)}\n" for file in sorted(path.glob("*.safetensors")))
    return hashlib.sha256(listing.encode()).hexdigest()


def parameters_hash(adapter: Adapter) -> str | None:
    """SHA-256 over the names, dtypes, shapes and bytes of the model's parameters and buffers
    (None for a model that is not an nn.Module, or whose tensors are not in memory)."""
    import torch

    model = getattr(adapter, "model", None)
    if not isinstance(model, torch.nn.Module):
        return None
    digest = hashlib.sha256()
    try:
        for name, tensor in sorted(model.state_dict().items()):
            data = tensor.detach().cpu().contiguous().reshape(-1)
            digest.update(f"{name}:{data.dtype}:{tuple(tensor.shape)}\n".encode())
            digest.update(data.view(torch.uint8).numpy().tobytes())
    except (RuntimeError, NotImplementedError, TypeError):  # meta or offloaded tensors
        return None
    return digest.hexdigest()


NOT_REBUILDABLE = (
    "the bundle cannot rebuild this model by itself (it was handed to maskcheck as an object, or built by a "
    "lambda or closure, which is not importable by name): set MODEL in its test file, or pass --model to maskcheck replay"
)


def model_source(adapter: Adapter) -> dict[str, Any]:
    """How a bundle finds its model again from any directory: the spec (a hook's or helper's
    factory when it is importable by name), the directory a ``module:`` spec imports from,
    and hashes to warn when the weights changed."""
    from ..adapters.specs import import_root

    spec = absolute_spec(getattr(adapter, "replay_spec", None) or adapter.spec)
    return {
        "spec": spec,
        "import_root": import_root(spec) if spec else None,
        "weights_sha256": weights_hash(spec),
        "parameters_sha256": parameters_hash(adapter),
        "note": None if spec else NOT_REBUILDABLE,
    }


def model_record(adapter: Adapter) -> dict[str, Any]:
    """:func:`model_source`, and how the spec was loaded: an override forces a layout, a task
    or an attention backend changes the model."""
    options = getattr(adapter, "load_options", None)
    return {
        **model_source(adapter),
        "overrides": dict(options.overrides) if options else {},
        "task": options.task if options else None,
        "attn_implementation": options.attn_implementation if options else None,
    }


# -- cases as plain data ----------------------------------------------------------------------


def case_record(case: Any) -> dict[str, Any]:
    kind = type(case)
    return {"type": f"{kind.__module__}:{kind.__qualname__}", "fields": dataclasses.asdict(case)}


def rebuild_case(record: dict[str, Any]) -> Any:
    """The case object from its record; JSON lists become the tuples the dataclass holds."""
    try:
        module_name, qualname = record["type"].split(":")
        cls = getattr(importlib.import_module(module_name), qualname)
        fields = {k: tuple(v) if isinstance(v, list) else v for k, v in record["fields"].items()}
        return cls(**fields)
    except (KeyError, ValueError, AttributeError, ImportError, TypeError) as exc:
        raise BundleError(
            f"cannot rebuild the case {record.get('type', '?') if isinstance(record, dict) else record!r}: {exc}"
        ) from None


# -- writing ----------------------------------------------------------------------------------


@dataclass
class FailedCheck:
    check: str
    case: Any
    outcome: Outcome
    path: str = "canonical"  # the call path it failed on (harness/adapters/paths.py)
    message: str | None = None  # the audit's last word on it (after the suite's conclude); None: the outcome's


def write_bundle(
    directory: Path, suite: Any, adapter: Adapter, context: RunContext, failures: list[FailedCheck]
) -> Path:
    """Replay each failing case with its inputs recorded, then write the bundle atomically."""
    from safetensors.torch import save_file

    recorder = RecordingAdapter(adapter)
    planned: dict[str, dict[str, Any]] = {}
    records = []
    for failure in failures:
        before = set(recorder.tensors)
        if failure.path not in planned:
            on_path = recorder.on_path(PATHS[failure.path])
            planned[failure.path] = {c.name: c for c in suite.checks(on_path, context) if hasattr(c, "evaluate")}
        checks = planned[failure.path]
        if failure.check in checks:
            checks[failure.check].outcome(failure.case)
        records.append(
            {
                "check": failure.check,
                "path": failure.path,
                "case": case_record(failure.case),
                "outcome": {
                    **{
                        k: getattr(failure.outcome, k)
                        for k in ("status", "max_diff", "floor", "threshold", "positions", "message")
                    },
                    "message": failure.message or failure.outcome.message,
                },
                "inputs": sorted(set(recorder.tensors) - before),
                "hypothesis_blob": failure.outcome.detail.get("hypothesis_blob"),
            }
        )
    data = {
        "format": BUNDLE_FORMAT,
        "suite": suite.name,
        "model": model_record(adapter),
        "seed": context.seed,
        "profile": context.profile,
        "dtype": context.dtype,
        "device": adapter.capabilities.device,
        "tolerance": dataclasses.asdict(context.tolerance),
        "checks": records,
    }
    from ..engine.registry import maskcheck_version

    data["maskcheck_version"] = maskcheck_version()

    def fill(staging: Path) -> None:
        (staging / CASE_FILE).write_text(json.dumps(data, indent=2, default=_jsonable) + "\n")
        save_file(recorder.tensors, str(staging / INPUTS_FILE), metadata={"suite": suite.name})
        (staging / f"test_repro_{suite.name}.py").write_text(repro_test_source(data))

    return write_folder_atomically(directory, fill)


def write_folder_atomically(directory: Path, fill: Any) -> Path:
    """``fill(staging)`` writes a folder's files into a staging folder beside ``directory``,
    which then replaces ``directory`` whole: a reader never sees half a bundle, and a bundle
    whose writing failed leaves the previous one in place."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        fill(staging)
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(staging, directory)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return directory


def _jsonable(value: Any) -> Any:
    if isinstance(value, tuple):
        return list(value)
    return str(value)


def repro_test_source(data: dict[str, Any]) -> str:
    suite, spec = data["suite"], data["model"]["spec"]
    checks = [c["check"] for c in data["checks"]]
    factory = (
        "MODEL = None  # None: rebuilt from the spec recorded in case.json\n"
        if spec
        else "# The bundle cannot rebuild the model by itself: set MODEL to it, e.g.\n"
        "# from mypkg.models import build; MODEL = build()\nMODEL = None\n"
    )
    return f'''"""Reproduction of a maskcheck failure: suite {suite!r} on {spec or "a model object"}.

Run it with plain pytest, from any directory:  pytest {Path(f"test_repro_{suite}.py")}
Each test replays one shrunk case and fails with the message maskcheck reported. A model
that cannot be rebuilt is an ERROR of the test's setup, never a FAIL.
Written by maskcheck {data.get("maskcheck_version", "?")}.
"""

from pathlib import Path

import pytest

from maskcheck.harness.report.reproduction import replay_check, replay_model

BUNDLE = Path(__file__).resolve().parent
{factory}

@pytest.fixture(scope="module")
def model():
    try:
        return replay_model(BUNDLE, MODEL)
    except Exception as exc:
        pytest.fail(f"cannot rebuild the model to replay on: {{exc}}", pytrace=False)


@pytest.mark.parametrize("check", {checks!r})
def test_repro_{suite}(check: str, model) -> None:
    result = replay_check(BUNDLE, check, model=model)
    if result.status == "fail":
        pytest.fail(result.report(), pytrace=False)
'''


# -- loading and replaying --------------------------------------------------------------------


@dataclass
class ReplayResult:
    suite: str
    check: str
    status: str
    message: str
    recorded_message: str
    model: str
    weights_note: str | None = None
    outcome: Outcome | None = field(default=None, repr=False)

    def report(self) -> str:
        lines = [f"{self.suite}/{self.check} on {self.model}: {self.status.upper()}: {self.message}"]
        if self.weights_note:
            lines.append(self.weights_note)
        if self.status == "fail" and self.message != self.recorded_message:
            lines.append(f"(recorded: {self.recorded_message})")
        return "\n".join(lines)


def load_bundle(path: str | Path) -> dict[str, Any]:
    """Read and validate ``case.json`` of a bundle directory (or the file itself)."""
    path = Path(path)
    file = path / CASE_FILE if path.is_dir() else path
    if not file.is_file():
        raise BundleError(f"no reproduction bundle at {path} (expected a directory with {CASE_FILE})")
    try:
        data = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BundleError(f"{file} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("checks"), list) or not isinstance(data.get("suite"), str):
        raise BundleError(f"{file} is not a maskcheck bundle (no suite or checks)")
    if data.get("format") not in READABLE_FORMATS:
        raise BundleError(
            f"{file} has bundle format {data.get('format')!r}; this maskcheck reads formats {', '.join(map(str, READABLE_FORMATS))}"
        )
    for record in data["checks"]:
        if (
            not isinstance(record, dict)
            or not isinstance(record.get("check"), str)
            or not isinstance(record.get("case"), dict)
        ):
            raise BundleError(f"{file}: a check entry lacks its name or case")
    if data["format"] == 1:
        for record in data["checks"]:
            record["case"] = _renamed_case_type(record["case"])
    return data


def _renamed_case_type(case: dict[str, Any]) -> dict[str, Any]:
    """A format-1 case record with its type under the maskcheck namespace
    (``suites.padding:PaddedCase`` -> ``maskcheck.suites.padding:PaddedCase``)."""
    kind = case.get("type")
    if isinstance(kind, str) and kind.split(".")[0] in ("harness", "suites", "reference_models"):
        return {**case, "type": f"maskcheck.{kind}"}
    return case


def replay(path: str | Path, model: Any = None, device: str | None = None) -> list[ReplayResult]:
    """Replay every failing check of a bundle, on its own model or on ``model`` (spec, object
    or adapter), and let the suite revise their verdicts as the audit did (its ``conclude``:
    one check's result can explain another's), so a replay tells the audit's story."""
    data = load_bundle(path)
    adapter = adapter_for_replay(data, model, device)
    results = [_replay_one(data, record, adapter) for record in data["checks"]]
    _conclude(data["suite"], results)
    return results


def replay_check(path: str | Path, check: str, model: Any = None, device: str | None = None) -> ReplayResult:
    """One check of a bundle, replayed beside the others (their results can revise its verdict)."""
    data = load_bundle(path)
    if not any(r["check"] == check for r in data["checks"]):
        raise BundleError(f"{path}: no check {check!r} in the bundle (has {[r['check'] for r in data['checks']]})")
    return next(r for r in replay(path, model, device) if r.check == check)


def _conclude(suite_name: str, results: list[ReplayResult]) -> None:
    """The suite's ``conclude`` over replayed results, its revisions copied back."""
    from ..engine.registry import load_suite
    from ..engine.verdict import CheckResult

    checks = [
        CheckResult(r.check, r.status, r.message, caveat=r.outcome.caveat if r.outcome is not None else None)
        for r in results
    ]
    load_suite(suite_name).conclude(checks)
    for result, check in zip(results, checks):
        result.status, result.message = check.status, check.message


def replay_model(path: str | Path, model: Any = None, device: str | None = None) -> Adapter:
    """The adapter a bundle replays on: ``model`` (spec, object or adapter) or the one it recorded."""
    return adapter_for_replay(load_bundle(path), model, device)


def adapter_for_replay(data: dict[str, Any], model: Any, device: str | None) -> Adapter:
    """The adapter to replay on (``model``: a model, a spec, or None for the one ``data["model"]``
    records), with ``replay_note`` set when its weights differ from the recorded ones."""
    from ..adapters.specs import LoadOptions, adapter_for, load_adapter

    if model is not None and not isinstance(model, str):
        return adapter_for(model)
    recorded = data["model"] if isinstance(data.get("model"), dict) else {}
    options = LoadOptions(
        device=device or str(data.get("device", "cpu")).split(":")[0],
        dtype=data.get("dtype"),
        task=recorded.get("task"),
        attn_implementation=recorded.get("attn_implementation"),
        overrides=dict(recorded.get("overrides") or {}),
    )
    if isinstance(model, str):
        return load_adapter(model, options)
    spec = recorded.get("spec")
    if not spec:
        raise BundleError(recorded.get("note") or NOT_REBUILDABLE)
    root = recorded.get("import_root")
    if root and root not in sys.path:
        sys.path.insert(0, root)  # a module: factory imports from where it was audited, whatever the working directory
    adapter = load_adapter(spec, options)
    adapter.replay_note = _changed_weights_note(spec, recorded, adapter)
    return adapter


def _changed_weights_note(spec: str, recorded: dict[str, Any], adapter: Adapter) -> str | None:
    for key, now in (
        ("weights_sha256", lambda: weights_hash(spec)),
        ("parameters_sha256", lambda: parameters_hash(adapter)),
    ):
        before = recorded.get(key)
        if before:
            current = now()
            if current != before:
                return f"warning: the weights behind {spec} changed since the bundle was written (sha256 {before[:12]}... -> {str(current)[:12]}...)"
            return None
    return None


def _replay_one(data: dict[str, Any], record: dict[str, Any], adapter: Adapter) -> ReplayResult:
    from ..engine.registry import load_suite

    note = getattr(adapter, "replay_note", None)
    suite = load_suite(data["suite"])
    case = rebuild_case(record["case"])
    tolerance = Tolerance(**data["tolerance"])
    context = RunContext(
        tolerance=tolerance,
        dtype=adapter.capabilities.dtype,
        units=adapter.capabilities.output_kind.units,
        seed=int(data.get("seed", 0)),
        profile=data.get("profile", "dev"),
    )
    recorded_message = record.get("outcome", {}).get("message", "")
    reason = suite.not_applicable(adapter.capabilities)
    if reason:
        return ReplayResult(
            data["suite"], record["check"], "not_applicable", reason, recorded_message, adapter.spec, note
        )
    path = record.get("path", CANONICAL.name)
    if path not in PATHS:
        raise BundleError(
            f"the bundle's check {record['check']} ran on call path {path!r}, which this maskcheck does not know"
        )
    checks = {c.name: c for c in suite.checks(adapter.on_path(PATHS[path]), context) if hasattr(c, "evaluate")}
    if record["check"] not in checks:
        raise BundleError(f"suite {data['suite']} has no check {record['check']!r} for {adapter.spec}")
    outcome = checks[record["check"]].outcome(case)
    message = outcome.message or f"max |d log p| = {outcome.max_diff:.3g} <= threshold {outcome.threshold:.3g}"
    if path != CANONICAL.name and outcome.status == "fail":  # as the audit words a failure on another path
        message = f"on the {path} path ({PATHS[path].description}): {message}"
    return ReplayResult(
        data["suite"], record["check"], outcome.status, message, recorded_message, adapter.spec, note, outcome
    )
