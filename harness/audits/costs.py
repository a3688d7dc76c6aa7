"""``maskcheck profile``: what running the model costs, over context length.

For each context length (doubling from 128 up to the model's maximum) it measures

- prefill latency of one sequence (P50, P95 over repeats);
- per-token decode latency with the KV cache (P50, P95), and per-token latency of
  generating *without* a cache (the whole prefix recomputed for every token): the
  asymptotic difference shows as a flat line against a rising one;
- KV-cache bytes per token, measured on the cache object (its 4-D key and value
  tensors, not the masks and positions kept beside them), against the formula
  ``2 (K and V) x layers x KV heads x head dim x dtype size``;
- peak memory: CUDA ``max_memory_allocated``, or on a CPU the process's peak RSS
  (``VmHWM``, reset before each length where Linux allows it).

``--max-seconds`` bounds the whole profile: it stops before a length whose predicted
time no longer fits, and says so.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..adapters.base import Adapter, Batch
from ..engine.cases import random_ids


@dataclass
class LengthCosts:
    length: int
    prefill_p50: float
    prefill_p95: float
    decode_p50: float
    decode_p95: float
    no_cache_per_token_p50: float
    kv_bytes_per_token: float
    kv_bytes_formula: float | None
    peak_memory_bytes: int | None
    seconds: float


@dataclass
class CostProfile:
    model: str
    device: str
    dtype: str
    lengths: list[LengthCosts] = field(default_factory=list)
    stopped: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.device,
            "dtype": self.dtype,
            "stopped": self.stopped,
            "lengths": [asdict(x) for x in self.lengths],
        }


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def tensor_bytes(value: Any, min_dim: int = 0, seen: set[int] | None = None) -> int:
    """Bytes of every distinct tensor of at least ``min_dim`` dimensions reachable from
    ``value`` (a cache object of any library). Keys and values are ``[B, H, T, D]``, so
    ``min_dim=4`` counts them and leaves out masks and positions kept beside them."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        key = value.untyped_storage().data_ptr() if value.numel() else id(value)
        if key in seen or value.dim() < min_dim:
            return 0
        seen.add(key)
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(tensor_bytes(v, min_dim, seen) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(tensor_bytes(v, min_dim, seen) for v in value)
    if hasattr(value, "__dict__") and not isinstance(value, (torch.nn.Module, type)):
        return sum(tensor_bytes(v, min_dim, seen) for v in vars(value).values())
    return 0


def kv_formula(adapter: Adapter) -> float | None:
    """Expected KV-cache bytes per token: 2 x layers x KV heads x head dim x dtype size."""
    config = getattr(adapter.model, "config", None)
    if config is None:
        return None
    if hasattr(config, "kv_heads"):  # a reference ModelConfig
        layers, heads, head_dim = config.n_layers, config.kv_heads, config.head_dim
    else:
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
        attention_heads = getattr(text, "num_attention_heads", None) or getattr(text, "n_head", None)
        heads = getattr(text, "num_key_value_heads", None) or attention_heads
        hidden = getattr(text, "hidden_size", None) or getattr(text, "n_embd", None)
        head_dim = getattr(text, "head_dim", None) or (
            hidden // attention_heads if hidden and attention_heads else None
        )
        if not (layers and heads and head_dim):
            return None
    size = torch.finfo(getattr(torch, adapter.capabilities.dtype)).bits // 8
    return float(2 * layers * heads * head_dim * size)


def reset_peak_memory(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        return
    try:  # Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) of this process
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def peak_memory(device: str) -> int | None:
    if device.startswith("cuda"):
        return int(torch.cuda.max_memory_allocated())
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _timed(device: str, function: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    started = time.perf_counter()
    out = function(*args)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started, out


def profile_length(adapter: Adapter, length: int, repeats: int, new_tokens: int, seed: int) -> LengthCosts:
    caps = adapter.capabilities
    device = caps.device
    started = time.perf_counter()
    ids = random_ids(seed, (1, length), caps.vocab_size, caps.pad_token_id, device)
    batch = Batch(ids, torch.ones_like(ids))
    reset_peak_memory(device)
    prefill, decode, no_cache = [], [], []
    state: Any = None
    for _ in range(repeats):
        seconds, (logits, state) = _timed(device, adapter.prefill, batch)
        prefill.append(seconds)
    token = logits[:, -1:].argmax(-1)  # [1, 1]
    kv_bytes = tensor_bytes(state, min_dim=4) / length
    for _ in range(new_tokens):
        seconds, (logits, state) = _timed(device, adapter.step, state, token)
        decode.append(seconds)
        token = logits[:, -1:].argmax(-1)
    sequence = ids
    for _ in range(max(2, new_tokens // 4)):  # without a cache every token recomputes the prefix
        seconds, logits = _timed(device, adapter.logits, Batch(sequence, torch.ones_like(sequence)))
        no_cache.append(seconds)
        sequence = torch.cat([sequence, logits[:, -1:].argmax(-1)], dim=1)
    return LengthCosts(
        length=length,
        prefill_p50=statistics.median(prefill),
        prefill_p95=percentile(prefill, 0.95),
        decode_p50=statistics.median(decode),
        decode_p95=percentile(decode, 0.95),
        no_cache_per_token_p50=statistics.median(no_cache),
        kv_bytes_per_token=kv_bytes,
        kv_bytes_formula=kv_formula(adapter),
        peak_memory_bytes=peak_memory(device),
        seconds=time.perf_counter() - started,
    )


def default_lengths(adapter: Adapter, new_tokens: int, start: int = 128) -> list[int]:
    """Doubling from ``start``, then the longest prompt that still leaves room for the decoded tokens."""
    top = (adapter.capabilities.max_length or 4096) - new_tokens
    lengths, length = [], start
    while length < top:
        lengths.append(length)
        length *= 2
    return [*lengths, top] if top > 0 else lengths


def profile(
    adapter: Adapter,
    lengths: list[int] | None = None,
    max_seconds: float = 120.0,
    repeats: int = 5,
    new_tokens: int = 16,
    seed: int = 0,
    progress: Callable[[LengthCosts], None] | None = None,
) -> CostProfile:
    """Profile ``adapter`` at each length while the predicted time fits ``max_seconds``."""
    caps = adapter.capabilities
    if not caps.has_cache or caps.family == "encoder":
        raise ValueError(f"{adapter.spec} declares no KV cache: maskcheck profile measures decoders")
    result = CostProfile(adapter.spec, caps.device, caps.dtype)
    budget_start = time.perf_counter()
    for length in lengths or default_lengths(adapter, new_tokens):
        if caps.max_length and length + new_tokens > caps.max_length:
            result.stopped = f"{length} + {new_tokens} decoded tokens is beyond the model's maximum {caps.max_length}"
            break
        elapsed = time.perf_counter() - budget_start
        if result.lengths:
            last = result.lengths[-1]
            # Attention and no-cache generation grow about quadratically with length.
            predicted = last.seconds * (length / last.length) ** 2
            if elapsed + predicted > max_seconds:
                result.stopped = f"stopped before {length}: predicted {predicted:.0f}s more would exceed --max-seconds {max_seconds:g}"
                break
        with torch.inference_mode():
            costs = profile_length(adapter, length, repeats, new_tokens, seed)
        result.lengths.append(costs)
        if progress:
            progress(costs)
    return result


def render(result: CostProfile) -> str:
    lines = [
        f"maskcheck profile of {result.model} ({result.device}, {result.dtype})",
        f"{'length':>7} {'prefill p50/p95 ms':>19} {'decode p50/p95 ms':>18} {'no-cache ms/token':>18} {'cache speed-up':>15} "
        f"{'KV B/token':>11} {'formula':>9} {'peak MB':>9}",
    ]
    for c in result.lengths:
        formula = f"{c.kv_bytes_formula:.0f}" if c.kv_bytes_formula else "-"
        peak = f"{c.peak_memory_bytes / 2**20:.0f}" if c.peak_memory_bytes else "-"
        lines.append(
            f"{c.length:>7} {c.prefill_p50 * 1e3:>9.2f} / {c.prefill_p95 * 1e3:<7.2f} {c.decode_p50 * 1e3:>8.2f} / {c.decode_p95 * 1e3:<7.2f} "
            f"{c.no_cache_per_token_p50 * 1e3:>18.2f} {c.no_cache_per_token_p50 / c.decode_p50:>14.1f}x {c.kv_bytes_per_token:>11.0f} {formula:>9} {peak:>9}"
        )
    if result.stopped:
        lines.append(result.stopped)
    return "\n".join(lines)


def draw(result: CostProfile, path: Path) -> Path:
    """Latency (left) and memory (right) against context length, log-log."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = [c.length for c in result.lengths]
    figure, (latency, memory) = plt.subplots(1, 2, figsize=(10, 3.8))
    latency.plot(lengths, [c.prefill_p50 * 1e3 for c in result.lengths], marker="o", label="prefill (whole prompt)")
    latency.plot(
        lengths, [c.decode_p50 * 1e3 for c in result.lengths], marker="o", label="decode, per token, with KV cache"
    )
    latency.plot(
        lengths,
        [c.no_cache_per_token_p50 * 1e3 for c in result.lengths],
        marker="o",
        label="decode, per token, no cache",
    )
    _log_axes(latency, "latency P50 (ms)")
    memory.plot(
        lengths,
        [c.kv_bytes_per_token * c.length / 2**20 for c in result.lengths],
        marker="o",
        label="KV cache (measured)",
    )
    if all(c.kv_bytes_formula for c in result.lengths):
        memory.plot(
            lengths,
            [c.kv_bytes_formula * c.length / 2**20 for c in result.lengths],
            linestyle="--",
            label="KV cache (formula)",
        )
    if all(c.peak_memory_bytes for c in result.lengths):
        memory.plot(
            lengths,
            [c.peak_memory_bytes / 2**20 for c in result.lengths],
            marker="s",
            label="peak memory (process)" if result.device == "cpu" else "peak CUDA memory",
        )
    _log_axes(memory, "MiB")
    figure.suptitle(f"cost profile: {result.model} ({result.device}, {result.dtype})", fontsize=10)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _log_axes(axes: Any, ylabel: str) -> None:
    from matplotlib.ticker import ScalarFormatter

    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    for axis in (axes.xaxis, axes.yaxis):  # 128, 256 ... rather than 2^7, 2^8
        formatter = ScalarFormatter()
        formatter.set_scientific(False)
        axis.set_major_formatter(formatter)
    axes.set_xlabel("context length (tokens)")
    axes.set_ylabel(ylabel)
    axes.legend(fontsize=8)
    axes.grid(alpha=0.3)
