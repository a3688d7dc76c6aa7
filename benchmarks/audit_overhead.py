"""How much an audit costs beyond the model's own forward passes.

    python benchmarks/audit_overhead.py [--model gpt2-small|tiny-reference|both] [--profile ci]

For each model, in one process:

1. a recording run of the audit captures every forward call the audit makes (its
   arguments, deep-copied before the call, so a cache that forward mutates is replayed
   as it was);
2. a timed run of the same audit (same seed and profile, so the same cases) without
   recording;
3. the recorded forwards are replayed on the bare model, timed.

It prints ``harness time / bare forward time`` (target: at most 1.3), the forwards per
case of each suite, and the wall time of the audit. ``--breakdown`` adds one more,
instrumented audit that splits each suite's time into the model's forwards, the
harness's work around them (building cases, comparing, the adapter) and Hypothesis
with the engine (drawing cases, running checks); its timers add a little overhead of
their own, so its figures say where the time goes, not what the ratio is.
``gpt2-small`` is a random-init GPT-2 with the 124M-parameter shape (768 wide, 12
layers, 50257 tokens); the cases keep the ``ci`` profile's own shapes. One torch thread by default, as a
pytest-xdist worker; ``--threads 2`` uses both cores of the CI machine. ``--device cuda``
and ``--dtype bfloat16|float16`` time the audit as deployed on a GPU: every timed forward
then ends with ``torch.cuda.synchronize()`` (the audit's own comparisons wait for the GPU
anyway), so the bare time is the GPU's work, not the launches'.
"""

from __future__ import annotations

import argparse
import collections
import copy
import dataclasses
import functools
import statistics
import time
import types
import warnings
from typing import Any, Callable

warnings.filterwarnings("ignore")

import torch  # noqa: E402

from maskcheck import audit  # noqa: E402
from maskcheck.harness import runner  # noqa: E402
from maskcheck.harness.specs import adapter_for  # noqa: E402


def gpt2_small() -> Any:
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(bos_token_id=1, eos_token_id=2, pad_token_id=0)  # the 124M shape
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def tiny_reference() -> Any:
    from maskcheck.reference_models import PRESETS, Transformer

    torch.manual_seed(0)
    return Transformer(PRESETS["tiny-decoder"]).eval()


MODELS: dict[str, Callable[[], Any]] = {"gpt2-small": gpt2_small, "tiny-reference": tiny_reference}


class Recorder:
    """Keeps (module, args, kwargs) of every forward of a model of the audited class,
    deep-copied before the call: the audited model and the models the audit builds from
    its weights (norm_checkpoint rebuilds them under other layouts) are all forwards the
    audit made. It wraps the class's ``forward`` while recording and restores it after."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[tuple[torch.nn.Module, tuple, dict, str]] = []
        self.suite = ""
        self.kind = type(model)
        self.original = self.kind.forward
        recorder = self

        @functools.wraps(self.original)  # adapters read forward's signature to learn what the model takes
        def forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            recorder.calls.append((module, copy.deepcopy(args), copy.deepcopy(kwargs), recorder.suite))
            return recorder.original(module, *args, **kwargs)

        self.kind.forward = forward  # type: ignore[method-assign]

    def remove(self) -> None:
        self.kind.forward = self.original  # type: ignore[method-assign]


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a timer read after it counts that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_audit(model: Any, profile: str, follower: Any = None) -> tuple[float, dict[str, float], Any]:
    """The audit's wall time, each suite's share of it, and the result; ``follower`` (a
    Recorder, or any object with a ``suite`` attribute) is told which suite is running."""
    per_suite: dict[str, float] = {}

    def progress(event: str, suite: str, result: Any) -> None:
        if event == "start":
            per_suite[suite] = time.perf_counter()
            if follower is not None:
                follower.suite = suite
        elif event == "done":
            per_suite[suite] = time.perf_counter() - per_suite[suite]

    adapter = adapter_for(model)
    device = next(model.parameters()).device
    synchronize(device)
    started = time.perf_counter()
    result = audit(adapter, profile=profile, progress=progress)
    synchronize(device)
    return time.perf_counter() - started, per_suite, result


def replay(calls: list[tuple[torch.nn.Module, tuple, dict, str]]) -> dict[str, float]:
    """Seconds the recorded forwards take on the bare models, per suite; each runs on a
    fresh copy of its inputs (copied outside the timed region)."""
    per_suite: dict[str, float] = {}
    with torch.inference_mode():
        for module, args, kwargs, suite in calls:
            args, kwargs = copy.deepcopy(args), copy.deepcopy(kwargs)
            device = next(module.parameters()).device
            synchronize(device)
            started = time.perf_counter()
            module(*args, **kwargs)
            synchronize(device)
            per_suite[suite] = per_suite.get(suite, 0.0) + time.perf_counter() - started
    return per_suite


def breakdown(model: Any, profile: str) -> dict[str, tuple[float, float, float]]:
    """Per suite: seconds in the model's forwards, in the harness's case work around them,
    and in Hypothesis and the engine, from one audit with timers around each forward and
    each case's evaluation."""
    forwards: dict[str, float] = collections.defaultdict(float)
    evaluating: dict[str, float] = collections.defaultdict(float)
    current = types.SimpleNamespace(suite="")
    kind, original_forward, original_run_check = type(model), type(model).forward, runner.run_check

    @functools.wraps(original_forward)
    def timed_forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        device = next(module.parameters()).device
        synchronize(device)
        started = time.perf_counter()
        try:
            return original_forward(module, *args, **kwargs)
        finally:
            synchronize(device)
            forwards[current.suite] += time.perf_counter() - started

    def timed_run_check(check: Any, context: Any) -> Any:
        def evaluate(case: Any) -> Any:
            started = time.perf_counter()
            try:
                return check.evaluate(case)
            finally:
                evaluating[current.suite] += time.perf_counter() - started

        return original_run_check(dataclasses.replace(check, evaluate=evaluate), context)

    kind.forward, runner.run_check = timed_forward, timed_run_check  # type: ignore[method-assign]
    try:
        _, suite_seconds, _ = run_audit(model, profile, current)
    finally:
        kind.forward, runner.run_check = original_forward, original_run_check  # type: ignore[method-assign]
    return {s: (forwards[s], evaluating[s] - forwards[s], total - evaluating[s]) for s, total in suite_seconds.items()}


def measure(name: str, profile: str, repeats: int, with_breakdown: bool = False, device: str = "cpu", dtype: str = "float32") -> dict[str, Any]:
    model = MODELS[name]().to(device=device, dtype=getattr(torch, dtype))
    parameters = sum(p.numel() for p in model.parameters())
    run_audit(model, profile)  # warm-up: first calls allocate and pick kernels
    recorder = Recorder(model)
    _, _, recorded = run_audit(model, profile, recorder)
    recorder.remove()
    audits, bares = [], []
    for _ in range(repeats):
        seconds, suite_seconds, result = run_audit(model, profile)
        audits.append((seconds, suite_seconds))
        bares.append(replay(recorder.calls))
    assert [s.status for s in result.suites] == [s.status for s in recorded.suites], "the timed run drew other cases"
    audit_time, bare_time = statistics.median(a for a, _ in audits), statistics.median(sum(b.values()) for b in bares)
    per_suite = {}
    for suite in recorded.suites:
        per_suite[suite.name] = {
            "status": suite.status,
            "cases": suite.cases,
            "forwards": sum(1 for *_, s in recorder.calls if s == suite.name),
            "audit": statistics.median(seconds.get(suite.name, 0.0) for _, seconds in audits),
            "bare": statistics.median(b.get(suite.name, 0.0) for b in bares),
        }
    return {
        "model": name,
        "parameters": parameters,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "forwards": len(recorder.calls),
        "audit": audit_time,
        "bare": bare_time,
        "ratio": audit_time / bare_time,
        "per_suite": per_suite,
        "breakdown": breakdown(model, profile) if with_breakdown else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="both", choices=[*MODELS, "both"])
    parser.add_argument("--profile", default="ci", choices=["dev", "ci", "thorough"])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the median is reported (default: 3)")
    parser.add_argument("--breakdown", action="store_true", help="also split each suite's time into forwards, harness and Hypothesis (one more audit)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default: 1, as a pytest-xdist worker; 2 = this machine's cores)")
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="the model's compute dtype (default: float32)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    names = list(MODELS) if args.model == "both" else [args.model]
    ok = True
    for name in names:
        r = measure(name, args.profile, args.repeats, args.breakdown, args.device, args.dtype)
        where = f"{args.device} {args.dtype}" if (args.device, args.dtype) != ("cpu", "float32") else f"{args.threads} thread(s)"
        print(f"\n{name} ({r['parameters'] / 1e6:.1f}M parameters), profile {args.profile}, torch {torch.__version__}, {where}")
        print(f"  {'suite':<16} {'status':<15} {'cases':>6} {'forwards':>9} {'per case':>9} {'audit s':>8} {'bare s':>8}")
        for suite, row in r["per_suite"].items():
            per_case = f"{row['forwards'] / row['cases']:.2f}" if row["cases"] else "-"
            print(f"  {suite:<16} {row['status']:<15} {row['cases']:>6} {row['forwards']:>9} {per_case:>9} {row['audit']:>8.2f} {row['bare']:>8.2f}")
        print(f"  audit wall time {r['audit']:.2f}s; the same {r['forwards']} forwards on the bare model {r['bare']:.2f}s")
        print(f"  harness time / bare forward time = {r['ratio']:.3f}  (target <= 1.3)")
        if r["breakdown"]:
            print(f"\n  where an instrumented audit's time goes, ms:\n  {'suite':<16} {'forwards':>9} {'harness':>8} {'hypothesis':>11}")
            for suite, seconds in r["breakdown"].items():
                print(f"  {suite:<16} " + " ".join(f"{1000 * x:>{w}.1f}" for x, w in zip(seconds, (9, 8, 11))))
            totals = [1000 * sum(column) for column in zip(*r["breakdown"].values())]
            print(f"  {'all':<16} " + " ".join(f"{x:>{w}.1f}" for x, w in zip(totals, (9, 8, 11))))
        ok &= r["ratio"] <= 1.3
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
