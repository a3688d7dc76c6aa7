"""Adapter for an exported ONNX graph (``onnx:PATH``), run by ONNX Runtime: what is deployed.

Inputs and outputs are found by optimum's names: ``input_ids``, ``attention_mask``,
``position_ids``, ``past_key_values.N.key``/``.value`` in; ``logits`` and
``present.N.key``/``.value`` out. What the graph cannot say (its family, its pad id) is
declared in ``PATH.maskcheck.json`` beside it (the fields of ``maskcheck_capabilities``) or
read from an optimum export's ``config.json``; what it accepts (a mask, position ids, a
cache, dynamic batch and length) is read from its inputs and measured by running it.

The caller owns the cache: a decoding state is the ``present.*`` arrays a call returned, fed
back as ``past_key_values.*``; a rollback slices them and a reorder picks their rows.

Loading is data only: no custom-op library is registered, an external weight file must
lie in the graph's own folder, and a file that is not an ONNX graph is one line.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .base import Adapter, AdapterError, Batch, Capabilities, extend, positions_from_mask

PAST = re.compile(r"^past_key_values\.(\d+)\.(key|value)$")
PRESENT = re.compile(r"^present\.(\d+)\.(key|value)$")
#: the capability fields a declaration file may give (the rest are read from the graph)
DECLARED = ("family", "vocab_size", "pad_token_id", "eos_token_id", "padding_side", "max_length", "attention", "window")
NO_BACKWARD = "an ONNX graph is run for inference only: it has no gradients to audit"
NO_DEFAULTS = "an ONNX graph's inputs have no defaults: every call passes every input"
NO_CACHE = "the graph has no past_key_values inputs (exported without a cache)"
#: the call paths a graph does not have, and why
UNAVAILABLE_PATHS = {
    "bare_call": NO_DEFAULTS,
    "default_cache": NO_DEFAULTS,
    "training": "an ONNX graph has no train mode",
    "float32_twin": "an ONNX graph's weights are its own: no float32 copy is made",
}


class OnnxLoadError(ValueError):
    """A graph that cannot be audited, in one line."""


@dataclass(frozen=True)
class OnnxState:
    past: tuple[np.ndarray, ...]  # past_key_values.0.key, .0.value, 1.key ... : [B, H, T_so_far, D] each
    mask: Tensor  # [B, T_so_far], 1 = real token
    next_position: Tensor  # [B]: real tokens so far


def graph_identity(path: Path, model: Any) -> dict[str, Any]:
    """What names the graph ``model`` (read from ``path``) in a report and a bundle: its
    path, SHA-256, opset and producer."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    opsets = {entry.domain or "ai.onnx": entry.version for entry in model.opset_import}
    return {
        "path": str(path),
        "sha256": digest,
        "opset": opsets.get("ai.onnx"),
        "producer": f"{model.producer_name} {model.producer_version}".strip(),
    }


def read_graph(path: Path) -> Any:
    """The graph at ``path`` without its weights, once every external weight file it names is
    found to lie in its own folder (no absolute path, no ``..``)."""
    import onnx
    from onnx.external_data_helper import uses_external_data

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - a corrupt or truncated file is one line
        raise OnnxLoadError(f"{path} is not an ONNX graph: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    folder = path.parent.resolve()
    for tensor in model.graph.initializer:
        if not uses_external_data(tensor):
            continue
        location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
        target = (folder / location).resolve()
        if not target.is_relative_to(folder):
            raise OnnxLoadError(f"{path}: weight file {location!r} lies outside the graph's folder; not read")
        if not target.is_file():
            raise OnnxLoadError(f"{path}: its weight file {location!r} is missing beside it")
    return model


def declarations(path: Path) -> dict[str, Any]:
    """``PATH.maskcheck.json`` beside the graph, else the fields an optimum export's config.json says."""
    declared = Path(f"{path}.maskcheck.json")
    if declared.is_file():
        try:
            fields = json.loads(declared.read_text())
        except json.JSONDecodeError as exc:
            raise OnnxLoadError(f"{declared}: not JSON ({exc})") from None
        unknown = sorted(set(fields) - set(DECLARED))
        if unknown:
            raise OnnxLoadError(f"{declared}: unknown field(s) {', '.join(unknown)}; known: {', '.join(DECLARED)}")
        return fields
    config = path.parent / "config.json"
    if config.is_file():
        data = json.loads(config.read_text())
        family = (
            "encoder" if data.get("is_encoder_decoder") is False and "bert" in str(data.get("model_type")) else None
        )
        found = {
            "vocab_size": data.get("vocab_size"),
            "pad_token_id": data.get("pad_token_id"),
            "max_length": data.get("max_position_embeddings") or data.get("n_positions"),
            "family": family,
        }
        return {k: v for k, v in found.items() if v is not None}
    return {}


class OnnxAdapter(Adapter):
    """An ONNX graph run by ONNX Runtime's CPU provider (or ``provider``), one session."""

    no_backward_reason = NO_BACKWARD
    inputs_have_defaults = False

    def __init__(self, path: str | Path, spec: str | None = None, provider: str = "CPUExecutionProvider") -> None:
        try:
            import onnxruntime
        except ImportError:
            raise OnnxLoadError("onnx: specs need onnx and onnxruntime: pip install 'maskcheck[onnx]'") from None
        path = Path(path)
        if not path.is_file():
            raise OnnxLoadError(f"no such ONNX file: {path}")
        graph = read_graph(path)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.log_severity_level = 3  # errors only: a warning would come before maskcheck's own lines
        try:
            session = onnxruntime.InferenceSession(str(path), options, providers=[provider])
        except Exception as exc:  # noqa: BLE001
            raise OnnxLoadError(f"{path}: ONNX Runtime refused it: {str(exc).splitlines()[0]}") from None
        self.path_on_disk = path
        self.identity = graph_identity(path, graph)
        self._recording: list[tuple[str, Tensor]] | None = None  # module outputs collected (module_outputs)
        self.session_settings = {
            "provider": provider,
            "graph_optimization_level": str(options.graph_optimization_level),
            "intra_op_threads": options.intra_op_num_threads,
        }
        self.inputs = {i.name: i for i in session.get_inputs()}
        self.outputs = {o.name: o for o in session.get_outputs()}
        self.past_names = sorted((n for n in self.inputs if PAST.match(n)), key=_layer_order)
        self.present_names = sorted((n for n in self.outputs if PRESENT.match(n)), key=_layer_order)
        self._check_names(path)
        super().__init__(session, self._capabilities(path))
        self.spec = spec or f"onnx:{path}"

    def _check_names(self, path: Path) -> None:
        if "input_ids" not in self.inputs or "logits" not in self.outputs:
            raise OnnxLoadError(
                f"{path}: maskcheck reads optimum's names (input_ids in, logits out); the graph takes "
                f"{', '.join(self.inputs)} and returns {', '.join(self.outputs)}"
            )
        if any(op in self.inputs for op in ("seqlens_k", "total_sequence_length")):
            raise OnnxLoadError(f"{path}: a graph with fused GroupQueryAttention inputs (seqlens_k) is not audited yet")
        if "use_cache_branch" in self.inputs:
            raise OnnxLoadError(
                f"{path}: optimum's merged graphs (use_cache_branch) are not audited yet; export one without"
            )
        if len(self.past_names) != len(self.present_names):
            raise OnnxLoadError(
                f"{path}: {len(self.past_names)} past_key_values inputs but {len(self.present_names)} present outputs"
            )
        static = [
            f"{name} {list(node.shape)}" for name, node in self.inputs.items()
            if not PAST.match(name) and not all(isinstance(d, str) or d is None for d in node.shape[:2])
        ]  # fmt: skip
        if static:
            raise OnnxLoadError(
                f"{path}: a graph with static shapes ({'; '.join(static)}) is not audited yet: export with dynamic "
                "batch and length (torch.onnx.export(..., dynamic_shapes=...))"
            )

    def _capabilities(self, path: Path) -> Capabilities:
        declared = declarations(path)
        vocab = declared.get("vocab_size") or _static_width(self.outputs["logits"])
        if not vocab:
            raise OnnxLoadError(f"{path}: the graph's logits have no static vocabulary dimension: declare vocab_size")
        return Capabilities(
            family=declared.get("family", "decoder"),
            vocab_size=int(vocab),
            takes_attention_mask="attention_mask" in self.inputs,
            takes_position_ids="position_ids" in self.inputs,
            # A graph's inputs have no defaults: a call without position ids does not exist, and
            # the adapter gives the ones every caller must, from the mask.
            derives_positions_from_mask="position_ids" in self.inputs,
            has_cache=bool(self.past_names),
            no_cache_reason=None if self.past_names else NO_CACHE,
            pad_token_id=declared.get("pad_token_id"),
            eos_token_id=declared.get("eos_token_id"),
            padding_side=declared.get("padding_side"),
            max_length=declared.get("max_length"),
            attention=declared.get("attention"),
            window=declared.get("window"),
            dtype=_dtype_of(self.outputs["logits"]),
        )

    # -- module outputs, where the exporter recorded them (compare's first differing module) --

    def module_outputs(self, run: Any) -> list[tuple[str, Tensor]]:
        """``(module name, output)`` of each module the exporter recorded (its nodes'
        ``pkg.torch.onnx.name_scopes``), in the order the graph computes them, during the call
        ``run`` makes: ``run(arm)`` calls ``arm()`` before the call to record. Empty for a
        graph without that metadata (the TorchScript exporter's, another tool's)."""
        records: list[tuple[str, Tensor]] = []

        def arm() -> None:
            self._recording = records

        try:
            run(arm)
        finally:
            self._recording = None
        return records

    def _instrumented(self) -> tuple[Any, list[tuple[str, str]]]:
        """A session of the graph with each module's output added to its outputs, and the
        ``(tensor, module name)`` pairs in graph order; built once."""
        cached = self.__dict__.get("_instrumented_session")
        if cached is None:
            cached = self.__dict__["_instrumented_session"] = instrument(self.path_on_disk, self.session_settings)
        return cached

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(graph=self.identity, session=self.session_settings, cache="present.* fed back as past_key_values.*")
        return info

    # -- paths that a graph does not have ---------------------------------------------------

    def _unavailable(self, path: Any) -> str | None:
        return UNAVAILABLE_PATHS.get(path.name) or super()._unavailable(path)

    # -- calls ------------------------------------------------------------------------------

    def _feed(self, ids: Tensor, mask: Tensor, positions: Tensor | None, past: tuple[np.ndarray, ...]) -> dict:
        feed: dict[str, np.ndarray] = {"input_ids": _int64(ids)}
        if "attention_mask" in self.inputs:
            feed["attention_mask"] = _int64(mask)
        if "position_ids" in self.inputs:
            feed["position_ids"] = _int64(
                positions if positions is not None else positions_from_mask(mask[:, -ids.shape[1] :])
            )
        feed.update(zip(self.past_names, past))
        return feed

    def _run(self, feed: dict) -> tuple[Tensor, tuple[np.ndarray, ...]]:
        names = ["logits", *self.present_names]
        recording = self._recording
        session, modules = self._instrumented() if recording is not None else (self.model, [])
        try:
            logits, *rest = session.run([*names, *(tensor for tensor, _ in modules)], feed)
        except Exception as exc:  # noqa: BLE001 - the graph's own error, one line
            raise AdapterError(f"ONNX Runtime raised {type(exc).__name__}: {str(exc).splitlines()[0][:300]}") from None
        present, outputs = rest[: len(self.present_names)], rest[len(self.present_names) :]
        for (_, module), value in zip(modules, outputs):
            if np.issubdtype(value.dtype, np.floating):
                recording.append((module, torch.from_numpy(np.ascontiguousarray(value)).float()))
        return torch.from_numpy(np.ascontiguousarray(logits)), tuple(present)

    def _empty_past(self, rows: int) -> tuple[np.ndarray, ...]:
        """``past_key_values.*`` of no tokens: ``[B, H, 0, D]`` each, their H and D read from the graph."""
        arrays = []
        for name in self.past_names:
            node = self.inputs[name]
            heads, width = (d if isinstance(d, int) else None for d in (node.shape[1], node.shape[3]))
            if heads is None or width is None:
                raise AdapterError(
                    f"{name} has no static head count and width {node.shape}: an empty cache cannot be made"
                )
            arrays.append(np.zeros((rows, heads, 0, width), dtype=_numpy_dtype(node.type)))
        return tuple(arrays)

    def _logits(self, batch: Batch) -> Tensor:
        if batch.decoder_input_ids is not None or batch.segment_ids is not None:
            raise AdapterError("an ONNX graph of one decoder or encoder takes neither a source nor segment ids")
        mask = batch.attention_mask if batch.attention_mask is not None else torch.ones_like(batch.input_ids)
        past = self._empty_past(batch.size) if self.past_names else ()
        logits, _ = self._run(self._feed(batch.input_ids, mask, batch.position_ids, past))
        return logits

    def _prefill(self, batch: Batch, rollback: bool = False) -> tuple[Tensor, OnnxState]:
        mask = batch.attention_mask if batch.attention_mask is not None else torch.ones_like(batch.input_ids)
        positions = batch.position_ids if batch.position_ids is not None else positions_from_mask(mask)
        logits, present = self._run(self._feed(batch.input_ids, mask, positions, self._empty_past(batch.size)))
        return logits, OnnxState(present, mask, mask.long().sum(-1))

    def _step(self, state: OnnxState, tokens: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, OnnxState]:
        full_mask, positions, next_position = extend(state.mask, state.next_position, attention_mask, tokens.shape[1])
        logits, present = self._run(self._feed(tokens, full_mask, positions, state.past))
        return logits, OnnxState(present, full_mask, next_position)

    def fork(self, state: Any) -> Any:
        return OnnxState(tuple(a.copy() for a in state.past), state.mask.clone(), state.next_position.clone())

    def _rollback(self, state: OnnxState, tokens: int) -> OnnxState:
        dropped = state.mask[:, -tokens:].long().sum(-1)  # [B]: real tokens rolled back
        past = tuple(a[:, :, :-tokens] for a in state.past)  # [B, H, T - n, D]
        return OnnxState(past, state.mask[:, :-tokens], state.next_position - dropped)

    def _rearrange(self, state: OnnxState, operation: str, index: Tensor) -> OnnxState:
        rows = index.cpu().numpy()
        return OnnxState(tuple(a[rows] for a in state.past), state.mask[index.cpu()], state.next_position[index.cpu()])


def instrument(path: Path, settings: dict[str, Any]) -> tuple[Any, list[tuple[str, str]]]:
    """:meth:`OnnxAdapter._instrumented`: a module's output is the one tensor its nodes make
    that a node outside it reads (or the graph returns); a module with several is left out."""
    import ast

    import onnx
    import onnxruntime

    model = onnx.load(str(path))
    nodes = list(model.graph.node)
    scopes = []
    for node in nodes:
        recorded = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), None)
        scopes.append(set(ast.literal_eval(recorded)[:-1]) - {""} if recorded else set())
    made: dict[str, int] = {output: i for i, node in enumerate(nodes) for output in node.output}
    readers: dict[str, list[int]] = {}
    for i, node in enumerate(nodes):
        for name in node.input:
            readers.setdefault(name, []).append(i)
    returned = {output.name for output in model.graph.output}
    escaping: dict[str, list[str]] = {}  # module -> the tensors its nodes make that leave it
    for tensor, maker in made.items():
        for module in scopes[maker]:
            outside = [r for r in readers.get(tensor, []) if module not in scopes[r]]
            if outside or tensor in returned:
                escaping.setdefault(module, []).append(tensor)
    chosen = sorted(
        (
            (tensors[0], module)
            for module, tensors in escaping.items()
            if len(tensors) == 1 and tensors[0] not in returned
        ),
        key=lambda pair: made[pair[0]],
    )
    model.graph.output.extend(onnx.helper.make_empty_tensor_value_info(tensor) for tensor, _ in chosen)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = settings["intra_op_threads"]
    options.log_severity_level = 3
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep every tensor named
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=[settings["provider"]])
    return session, chosen


def _layer_order(name: str) -> tuple[int, int]:
    found = PAST.match(name) or PRESENT.match(name)
    assert found is not None
    return int(found.group(1)), 0 if found.group(2) == "key" else 1


def _static_width(node: Any) -> int | None:
    width = node.shape[-1] if node.shape else None
    return width if isinstance(width, int) else None


def _dtype_of(node: Any) -> str:
    return {"tensor(float16)": "float16", "tensor(bfloat16)": "bfloat16"}.get(node.type, "float32")


def _numpy_dtype(onnx_type: str) -> Any:
    return {"tensor(float16)": np.float16, "tensor(double)": np.float64}.get(onnx_type, np.float32)


def _int64(tensor: Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.int64).numpy()
