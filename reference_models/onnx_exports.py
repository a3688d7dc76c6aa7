"""ONNX exports the tests write, clean and with one seeded export bug each, with the PyTorch
model each was exported from (which passes every suite).

Each is exported with ``torch.onnx.export`` (the dynamo exporter, dynamic batch and length)
through a wrapper that takes what the graph is audited with, under optimum's names:
``input_ids``, ``attention_mask``, ``position_ids`` (and ``past_key_values.N.key/value``)
in, ``logits`` (and ``present.N.key/value``) out. Writing one takes a few seconds.

- :func:`export_hf` (GPT-2, Llama), with the cache or without, traced on a left-padded example.
- :func:`export_cached` (the reference decoder, with its cache as inputs and outputs):
  ``forgets_cached_padding=True`` writes the wrapper a careless export script writes, which
  passes the model the new tokens' mask and ones for the cached slots: a prefill and an
  unpadded decode are right, a left-padded prompt's padded slots are read by every step.
- :func:`export_additive` (a plain decoder whose mask is additive): in float32 clean; in
  float16 (``half=True``) its ``torch.finfo(torch.float32).min`` becomes ``-inf``, so a
  padded query whose every key is masked gets NaN, which the next layer's values carry into
  the real tokens of a padded batch; its PyTorch model in float32 passes.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .config import ModelConfig
from .model import KVCache, Transformer

#: the decoder the cached exports are written from: rotary positions, so a wrong position shows
CACHED = ModelConfig(n_layers=2, position="rotary", vocab_size=64, max_seq_len=128)


class LogitsExport(nn.Module):
    """``forward(input_ids, attention_mask, position_ids) -> logits`` of a transformers causal LM."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor) -> Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
        return out.logits


class TwoLayerCacheExport(nn.Module):
    """A wrapper whose forward takes a two-layer cache as arrays, ``forward(input_ids [B, T],
    attention_mask [B, T_past + T], position_ids [B, T], k0, v0, k1, v1) -> (logits, k0',
    v0', k1', v1')``, each ``[B, H, T_past (+ T), D]``: the exporter takes named arguments,
    not ``*past``. Subclasses run the model in :meth:`run`."""

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        k0: Tensor,
        v0: Tensor,
        k1: Tensor,
        v1: Tensor,
    ) -> tuple:
        return self.run(input_ids, attention_mask, position_ids, (k0, v0, k1, v1))

    def run(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, past: tuple[Tensor, ...]) -> tuple:
        raise NotImplementedError


class CachedExport(TwoLayerCacheExport):
    """The reference decoder (:data:`CACHED`) with its cache as arrays."""

    def __init__(self, model: Transformer, forgets_cached_padding: bool = False) -> None:
        super().__init__()
        self.model = model
        self.forgets_cached_padding = forgets_cached_padding

    def run(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, past: tuple[Tensor, ...]) -> tuple:
        batch, past_length = input_ids.shape[0], past[0].shape[2]
        if self.forgets_cached_padding:  # the bug: every cached slot taken for a real token
            cached = torch.ones_like(attention_mask[:, :past_length])
            attention_mask = torch.cat([cached, attention_mask[:, past_length:]], dim=1)  # [B, T_past + T]
        cache = KVCache(
            keys=tuple(past[0::2]),
            values=tuple(past[1::2]),
            real=attention_mask[:, :past_length].bool(),
            positions=torch.zeros(batch, past_length, dtype=torch.long, device=input_ids.device),
            token_embeddings=torch.zeros(batch, 0, self.model.config.d_model, device=input_ids.device),  # no shift
        )
        out = self.model(input_ids, attention_mask.bool(), position_ids, cache=cache)  # bool: no data-dependent check
        assert out.cache is not None
        present = [t for pair in zip(out.cache.keys, out.cache.values) for t in pair]
        return (out.logits, *present)


class AdditiveMaskDecoder(nn.Module):
    """A plain decoder whose attention mask is added to the scores: ``finfo(float32).min`` at
    the keys a query may not read (a padded query reads none)."""

    maskcheck_capabilities = {"family": "decoder", "vocab_size": 64, "max_length": 128, "pad_token_id": 0}

    def __init__(self, vocab: int = 64, width: int = 32, layers: int = 2) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Embedding(128, width)
        self.qkv = nn.ModuleList(nn.Linear(width, 3 * width) for _ in range(layers))
        self.head = nn.Linear(width, vocab)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor:
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        if position_ids is None:
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # counted over real tokens
        x = self.embed(input_ids) + self.position(position_ids)  # [B, T, D]
        index = torch.arange(input_ids.shape[1], device=input_ids.device)
        allowed = (index[None, :] <= index[:, None])[None] & attention_mask.bool()[:, None, :]  # [B, T, T]
        for qkv in self.qkv:
            q, k, v = qkv(x).chunk(3, dim=-1)  # [B, T, D] each
            scores = (q @ k.transpose(1, 2) / x.shape[-1] ** 0.5).masked_fill(~allowed, torch.finfo(torch.float32).min)
            x = x + torch.softmax(scores, dim=-1) @ v
        return self.head(x)  # [B, T, V]


class CachedLogitsExport(TwoLayerCacheExport):
    """A two-layer transformers causal LM with its cache as arrays: they become the
    ``DynamicCache`` the model reads and extends."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def run(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, past: tuple[Tensor, ...]) -> tuple:
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        for layer, (keys, values) in enumerate(zip(past[0::2], past[1::2])):
            cache.update(keys, values, layer)
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, past_key_values=cache,
            use_cache=True,
        )  # fmt: skip
        layers = out.past_key_values.layers
        return (out.logits, *(t for layer in layers for t in (layer.keys, layer.values)))


def export_hf(name: str, path: str | Path, cache: bool = False) -> Path:
    """A tiny transformers causal LM (``hf_tiny.tiny_model(name)``), exported with its cache or without."""
    from .hf_tiny import tiny_model

    model = tiny_model(name, "sdpa")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    model.config.to_json_file(Path(path).parent / "config.json")  # beside the graph, as optimum writes it
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (2, 7 if not cache else 3), generator=generator)
    if not cache:
        mask = torch.ones_like(ids)
        mask[0, :2] = 0  # left padding: the trace takes the padded path
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
        shapes = {name: {0: batch, 1: length} for name in ("input_ids", "attention_mask", "position_ids")}
        return _export(LogitsExport(model), (ids, mask, positions), shapes, ["logits"], path)
    config = model.config
    assert config.num_hidden_layers == 2, "CachedLogitsExport takes two layers"
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    width = config.hidden_size // config.num_attention_heads
    past = tuple(torch.randn(2, heads, 2, width, generator=generator) for _ in range(4))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, 0] = 0  # a left-padded row in the traced cache
    positions = torch.tensor([[1, 2, 3], [2, 3, 4]])
    return _export(
        CachedLogitsExport(model), (ids, mask, positions, *past), _cached_shapes(2), _cached_outputs(2), path
    )


def cached_model() -> Transformer:
    """The PyTorch model :func:`export_cached` exports (a ``module:`` spec's factory)."""
    torch.manual_seed(0)
    return Transformer(CACHED).eval()


def export_cached(path: str | Path, forgets_cached_padding: bool = False) -> Path:
    """The reference decoder (:func:`cached_model`) exported with its cache."""
    model = cached_model()
    export = CachedExport(model, forgets_cached_padding).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, CACHED.vocab_size, (2, 3), generator=generator)
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[0, 0] = 0  # a left-padded row in the traced cache
    positions = torch.tensor([[1, 2, 3], [2, 3, 4]])
    heads, width = CACHED.kv_heads, CACHED.head_dim
    past = tuple(torch.randn(2, heads, 2, width, generator=generator) for _ in range(2 * CACHED.n_layers))
    shapes, outputs = _cached_shapes(CACHED.n_layers), _cached_outputs(CACHED.n_layers)
    return _export(export, (ids, mask, positions, *past), shapes, outputs, path)


def _cached_shapes(layers: int) -> dict[str, Any]:
    """A cached export's inputs, by optimum's names, and their dynamic dimensions."""
    batch, length, past_length = torch.export.Dim("batch"), torch.export.Dim("length"), torch.export.Dim("past")
    past_names = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    return {
        "input_ids": {0: batch, 1: length},
        "attention_mask": {0: batch, 1: torch.export.Dim("total")},  # the cache's tokens, then the new ones
        "position_ids": {0: batch, 1: length},
        **{name: {0: batch, 2: past_length} for name in past_names},
    }


def _cached_outputs(layers: int) -> list[str]:
    return ["logits", *(f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value"))]


def export_additive(path: str | Path, half: bool = False, external_data: bool = False) -> Path:
    """:class:`AdditiveMaskDecoder` exported in float32, or in float16 (``half``); with
    ``external_data``, its weights in a file beside the graph (``model.onnx.data``), as the
    exporter writes a large model's."""
    model = AdditiveMaskDecoder().eval()
    if half:
        model = model.half()
    ids = torch.randint(3, 64, (2, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    batch, length = torch.export.Dim("batch"), torch.export.Dim("length")
    shapes = {name: {0: batch, 1: length} for name in ("input_ids", "attention_mask", "position_ids")}
    return _export(model, (ids, mask, positions), shapes, ["logits"], path, external_data)


def exported(export: Any, *args: Any, **kwargs: Any) -> Path:
    """The graph ``export(path, ...)`` writes, in a folder removed at exit (the seeded export
    bugs' and their clean twins' builder); ``maskcheck.adapter_for`` runs a ``.onnx`` path."""
    folder = Path(tempfile.mkdtemp(prefix="maskcheck-onnx-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return export(folder / "model.onnx", *args, **kwargs)


def _export(
    module: nn.Module, args: tuple, shapes: dict[str, Any], outputs: list[str], path: str | Path, external: bool = False
) -> Path:
    """``torch.onnx.export`` (dynamo) of ``module`` on ``args``, the inputs named and their
    dynamic dimensions given by ``shapes`` (in the order of ``args``), into one file."""
    import contextlib
    import io

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), contextlib.redirect_stdout(io.StringIO()):  # the exporter prints its progress
        torch.onnx.export(
            module.eval(), args, str(path), input_names=list(shapes), output_names=outputs,
            dynamic_shapes=tuple(shapes.values()), dynamo=True, external_data=external,
        )  # fmt: skip
    return path
