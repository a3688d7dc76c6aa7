"""How much an audit costs beyond the model's own forward passes.

    python benchmarks/audit_overhead.py [--model gpt2-small|tiny-reference|both] [--profile ci]

For each model, in one process:

1. a recording run of the audit captures every forward call the audit makes (its
   arguments, deep-copied before the call, so a cache that forward mutates is replayed
   as it was);
2. a timed run of the same audit (same seed and profile, so the same cases) without
   recording;
3. the recorded calls are replayed on the bare model, timed, each as the audit made it:
   the training path's forwards with gradients recorded in train mode, and the gradient
   checks' forwards followed by their backward to the token embeddings.

It prints ``audit time / bare model time`` (the overhead ratio; target: at most 1.3), the forwards per
case of each suite, and the wall time of the audit. ``--breakdown`` adds one more,
instrumented audit that splits each suite's time into the model's forwards, the
harness's work around them (building cases, comparing, the adapter) and Hypothesis
with the engine (drawing cases, running checks); its timers add a little overhead of
their own, so its figures say where the time goes, not what the ratio is.
``--count`` times nothing: it counts one audit's forwards, rows, input tokens and
positions projected to the vocabulary, by suite and call path, what the audit asks of
any machine (``--model gpt2-narrow`` draws gpt2-small's cases at a fiftieth of its compute).
``--peer PYTHON`` adds, to gpt2-small's measurement, ``maskcheck audit`` of it against
pytest-torch's zero-code run of the same factory, each as a whole process (what a user
waits for), alternating with the timed audits, medians of ``--repeats``: ``--model both
--peer PYTHON --repeats 5`` prints everything in one run, ``--scaling``'s table last.
``--peer-only`` times only those two processes; with ``--examples N``, the audit of N
cases a check (``--examples 1``: the minimal cases alone, the smallest audit of every suite
and path). ``--scaling`` counts the audit against context length and prices it against
model size (tiny, 124M and 350M GPT-2 shapes).
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
import contextlib
import copy
import dataclasses
import functools
import os
import statistics
import time
import types
import warnings
from typing import Any, Iterator

warnings.filterwarnings("ignore")

import torch  # noqa: E402
from benchmark_models import COUNTED, MODELS, gpt2_shape, gpt2_small  # noqa: E402
from versus_peer import audit_process, medians, peer_run, print_comparison, print_versus_peer  # noqa: E402

from maskcheck import audit  # noqa: E402
from maskcheck.harness.adapters.memo import tensor_fingerprint  # noqa: E402
from maskcheck.harness.adapters.specs import adapter_for  # noqa: E402
from maskcheck.harness.engine.profile_names import PROFILE_NAMES  # noqa: E402

#: the sizes ``--scaling`` sets side by side: (name, width, layers, heads)
GPT2_SIZES = (
    ("gpt2-tiny (64 wide)", 64, 1, 4),
    ("gpt2-small (124M)", 768, 12, 12),
    ("gpt2-medium (350M)", 1024, 24, 16),
)
SCALING_CONTEXTS = (128, 256, 1024, 2048)


@dataclasses.dataclass
class Call:
    """One model call of the audit: a forward, as it was made, and whether a backward followed."""

    module: torch.nn.Module
    args: tuple
    kwargs: dict
    suite: str
    grad: bool  # gradients were recorded (the training path, the gradient checks)
    training: bool  # the module was in train mode
    backward: bool = False  # a gradient check differentiated it (torch.autograd.grad)


class Recorder:
    """Keeps every forward of a model of the audited class (its inputs deep-copied before
    the call, its grad and train modes) and marks the forwards a gradient check then
    differentiated: the audited model and the models the audit builds from its weights
    (norm_checkpoint rebuilds them under other layouts) are all calls the audit made. It
    wraps the class's ``forward`` and ``torch.autograd.grad`` while recording and restores
    them after."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.calls: list[Call] = []
        self.suite = GATE  # until the first suite starts
        self.kind = type(model)
        self.original = self.kind.forward
        self.original_grad = torch.autograd.grad
        recorder = self

        @functools.wraps(self.original)  # adapters read forward's signature to learn what the model takes
        def forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            grad = torch.is_grad_enabled() and not torch.is_inference_mode_enabled()
            call = Call(module, copy.deepcopy(args), copy.deepcopy(kwargs), recorder.suite, grad, module.training)
            recorder.calls.append(call)
            return recorder.original(module, *args, **kwargs)

        @functools.wraps(self.original_grad)
        def grad(*args: Any, **kwargs: Any) -> Any:
            if recorder.calls:
                recorder.calls[-1].backward = True
            return recorder.original_grad(*args, **kwargs)

        self.kind.forward = forward  # type: ignore[method-assign]
        torch.autograd.grad = grad

    def remove(self) -> None:
        self.kind.forward = self.original  # type: ignore[method-assign]
        torch.autograd.grad = self.original_grad


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work, so a timer read after it counts that work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


GATE = "(gate)"


def run_audit(
    model: Any,
    profile: str,
    follower: Any = None,
    batch_cases: bool = True,
    suites: list[str] | None = None,
    examples: int | None = None,
) -> tuple[float, dict[str, float], Any]:
    """The audit's wall time, each suite's share of it, and the result; ``follower`` (a
    Recorder, or any object with a ``suite`` attribute) is told which suite is running.
    ``model``: a model or an adapter; ``suites`` None: every suite."""
    per_suite: dict[str, float] = {}

    def progress(event: str, suite: str, result: Any) -> None:
        if event == "start":
            if not per_suite:  # what ran before the first suite: the batching gate (padding/batch_composition)
                per_suite[GATE] = time.perf_counter() - started
            per_suite[suite] = time.perf_counter()
            if follower is not None:
                follower.suite = suite
        elif event == "done":
            per_suite[suite] = time.perf_counter() - per_suite[suite]

    adapter = adapter_for(model)
    device = next(adapter.model.parameters()).device
    synchronize(device)
    started = time.perf_counter()
    result = audit(adapter, suites, profile=profile, progress=progress, batch_cases=batch_cases, examples=examples)
    synchronize(device)
    return time.perf_counter() - started, per_suite, result


def replay(calls: list[Call]) -> dict[str, float]:
    """Seconds the recorded model calls take on the bare models, per suite: each forward on
    a fresh copy of its inputs, in the mode the audit made it (train mode with dropout off
    and gradients recorded, for the training path and the gradient checks), then, where a
    gradient check differentiated it, the backward of its log-probabilities to the token
    embeddings. Inputs are copied and modes set outside the timed region."""
    per_suite: dict[str, float] = {}
    for call in calls:
        args, kwargs = copy.deepcopy(call.args), copy.deepcopy(call.kwargs)
        device = next(call.module.parameters()).device
        with as_recorded(call) as leaves, torch.inference_mode(not call.grad), torch.set_grad_enabled(call.grad):
            synchronize(device)
            started = time.perf_counter()
            out = call.module(*args, **kwargs)
            if call.backward:
                logits = out.logits if hasattr(out, "logits") else out[0] if isinstance(out, tuple) else out
                torch.autograd.grad(torch.log_softmax(logits, -1).sum(), leaves[-1])
            synchronize(device)
            per_suite[call.suite] = per_suite.get(call.suite, 0.0) + time.perf_counter() - started
    return per_suite


@contextlib.contextmanager
def as_recorded(call: Call) -> Iterator[list[torch.Tensor]]:
    """The module in the call's train mode with every dropout off, as the audit ran it; for a
    call a gradient check differentiated, the token embeddings' outputs become leaves that
    record gradients (yielded, in the order made). Restores the module after."""
    module = call.module
    dropouts = [(m, m.p) for m in module.modules() if isinstance(m, torch.nn.modules.dropout._DropoutNd)]
    leaves: list[torch.Tensor] = []
    handle = None
    if call.backward:
        embedding = adapter_for(module).embedding_module()

        def leaf(_module: Any, _inputs: Any, output: torch.Tensor) -> torch.Tensor:
            leaves.append(output.detach().requires_grad_(True))
            return leaves[-1].clone()

        handle = embedding.register_forward_hook(leaf)
    training = module.training
    try:
        for dropout, _ in dropouts:
            dropout.p = 0.0
        module.train(call.training)
        yield leaves
    finally:
        module.train(training)
        for dropout, p in dropouts:
            dropout.p = p
        if handle is not None:
            handle.remove()


def breakdown(model: Any, profile: str) -> dict[str, tuple[float, float]]:
    """Per suite: seconds in the model's forwards, and in everything else (building and
    judging cases, the adapter, Hypothesis and the engine), from one audit with a timer
    around each forward."""
    forwards: dict[str, float] = collections.defaultdict(float)
    current = types.SimpleNamespace(suite=GATE)
    kind, original_forward = type(model), type(model).forward

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

    kind.forward = timed_forward  # type: ignore[method-assign]
    try:
        _, suite_seconds, _ = run_audit(model, profile, current)
    finally:
        kind.forward = original_forward  # type: ignore[method-assign]
    return {s: (forwards[s], total - forwards[s]) for s, total in suite_seconds.items()}


def forward_cost(model: Any, repeats: int = 5) -> tuple[list[tuple[int, int, float]], float, float]:
    """Seconds of one forward at a grid of (rows, length), and the least-squares fit
    ``fixed + per_token x rows x length``: what stacking cases can save (the fixed part)
    and what it cannot (the tokens). The grid holds the shapes an audit's forwards have."""
    device = next(model.parameters()).device
    grid = [(1, 8), (2, 8), (4, 8), (8, 8), (16, 8), (1, 16), (3, 16), (6, 16), (12, 16), (24, 16), (48, 16)]
    vocab = model.config.vocab_size
    timings = []
    with torch.inference_mode():
        for rows, length in grid:
            ids = torch.randint(3, vocab, (rows, length), generator=torch.Generator().manual_seed(0)).to(device)
            model(input_ids=ids)  # warm-up for this shape
            synchronize(device)
            started = time.perf_counter()
            for _ in range(repeats):
                model(input_ids=ids)
            synchronize(device)
            timings.append((rows, length, (time.perf_counter() - started) / repeats))
    tokens = torch.tensor([[1.0, r * t] for r, t, _ in timings], dtype=torch.float64)
    seconds = torch.tensor([[s] for _, _, s in timings], dtype=torch.float64)
    fixed, per_token = torch.linalg.lstsq(tokens, seconds).solution.flatten().tolist()
    return timings, fixed, per_token


def count(
    target: Any,
    profile: str,
    suites: list[str] | None = None,
    examples: int | None = None,
    by_check: dict[str, collections.Counter] | None = None,
    by_kind: dict[str, collections.Counter] | None = None,
) -> tuple[dict[tuple[str, str], collections.Counter], Any]:
    """Forwards, rows and input tokens of one audit, by (suite, call path): what an audit
    asks of the model, whatever the machine. ``target``: a model, an adapter or a spec
    (``mutant:NAME``); ``examples`` replaces the profile's case count, as ``--examples``
    does. Backward passes of the gradient checks are counted as the forwards they follow
    (``grad``). ``by_check`` receives the same tallies by ``suite/check`` (every path), and
    ``by_kind`` by what the forward is (:func:`forward_kind`)."""
    from maskcheck.harness.adapters.specs import load_adapter
    from maskcheck.harness.audits import runner

    adapter = load_adapter(target) if isinstance(target, str) else adapter_for(target)
    counts: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    where = types.SimpleNamespace(suite=GATE, path="canonical", check="")
    kind, original_run_one = type(adapter.model), runner._run_one
    original_forward = kind.forward

    computed: set[tuple] = set()  # every row of a full forward or prefill so far, as forward_kind keys it

    @functools.wraps(original_forward)
    def counted_forward(module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        ids = kwargs.get("input_ids", args[0] if args else None)
        tallies = [counts[(where.suite, where.path)]]
        if by_check is not None:
            tallies.append(by_check[f"{where.suite}/{where.check}" if where.check else where.suite])
        if by_kind is not None:
            tallies.append(by_kind[forward_kind(module, kwargs, ids, computed)])
        for tally in tallies:
            tally["forwards"] += 1
            tally["grad"] += torch.is_grad_enabled()
            if isinstance(ids, torch.Tensor):
                tally["rows"] += ids.shape[0]
                tally["tokens"] += ids.numel()
                keep = kwargs.get("logits_to_keep") or ids.shape[-1]  # the positions projected to the vocabulary
                tally["projected"] += ids.shape[0] * min(keep, ids.shape[-1])
        return original_forward(module, *args, **kwargs)

    def run_one(
        check: Any,
        context: Any,
        result: Any,
        failures: Any,
        suite: str = "",
        path: str = "canonical",
        *rest: Any,
        **kwargs: Any,
    ) -> Any:
        where.path, where.check = path, getattr(check, "name", "")
        try:
            return original_run_one(check, context, result, failures, suite, path, *rest, **kwargs)
        finally:
            where.path, where.check = "canonical", ""

    kind.forward = counted_forward  # type: ignore[method-assign]
    runner._run_one = run_one
    try:
        _, _, result = run_audit(adapter, profile, where, suites=suites, examples=examples)
    finally:
        kind.forward = original_forward  # type: ignore[method-assign]
        runner._run_one = original_run_one
    return counts, result


def forward_kind(module: torch.nn.Module, kwargs: dict, ids: Any, computed: set[tuple]) -> str:
    """What a forward of a transformers model is: a cached decode step, a prefill, a loss, a
    forward with gradients (the training path, the gradient checks) or one of logits; and
    for all but a step, whether every row of it (ids, mask, positions, mode) was computed
    in an earlier forward of the audit (``computed``, updated): a noise floor's copy, a
    fresh decode's repeat, a loss beside its logits."""
    cache = kwargs.get("past_key_values", kwargs.get("cache"))
    length = getattr(cache, "get_seq_length", None)
    if cache is not None and (not callable(length) or int(length()) > 0):
        return "decode step"
    if cache is not None or kwargs.get("use_cache"):
        kind = "prefill"
    elif kwargs.get("labels") is not None:
        kind = "loss"
    elif torch.is_grad_enabled():
        kind = "with gradients"
    else:
        kind = "logits"
    if not isinstance(ids, torch.Tensor):
        return kind
    mask, positions = kwargs.get("attention_mask"), kwargs.get("position_ids")

    def digest(value: Any, row: int) -> Any:
        return None if not isinstance(value, torch.Tensor) else tensor_fingerprint(value[row])

    rows = [
        (torch.is_grad_enabled(), module.training, digest(ids, r), digest(mask, r), digest(positions, r))
        for r in range(ids.shape[0])
    ]
    repeated = all(row in computed for row in rows)
    computed.update(rows)
    return f"{kind}, every row computed before" if repeated else kind


def print_kind_counts(by_kind: dict[str, collections.Counter]) -> None:
    print("\n  forwards by kind (every path)")
    for kind, tally in sorted(by_kind.items(), key=lambda item: -item[1]["forwards"]):
        print(f"  {kind:<42} {tally['forwards']:>6} forwards {tally['tokens']:>8} tokens")


def print_counts(name: str, profile: str, counts: dict[tuple[str, str], collections.Counter], result: Any) -> None:
    suites = list(dict.fromkeys(suite for suite, _ in counts))
    paths = list(dict.fromkeys(path for _, path in counts))
    print(f"\n{name}, profile {profile}: forwards / input tokens of one audit, by suite and call path")
    print(f"  {'suite':<16} {'status':<15}" + "".join(f" {path:>18}" for path in paths) + f" {'all':>18}")
    totals: collections.Counter = collections.Counter()
    for suite in suites:
        status = next((s.status for s in result.suites if s.name == suite), "")
        row = [counts.get((suite, path), collections.Counter()) for path in paths]
        cells = "".join(f" {c['forwards']:>7} / {c['tokens']:>8}" for c in row)
        all_ = sum(row, collections.Counter())
        totals.update(all_)
        print(f"  {suite:<16} {status:<15}{cells} {all_['forwards']:>7} / {all_['tokens']:>8}")
    by_path = [
        sum((counts.get((s, path), collections.Counter()) for s in suites), collections.Counter()) for path in paths
    ]
    print(
        f"  {'all':<16} {'':<15}"
        + "".join(f" {c['forwards']:>7} / {c['tokens']:>8}" for c in by_path)
        + f" {totals['forwards']:>7} / {totals['tokens']:>8}"
    )
    print(
        f"  {totals['grad']} of the forwards with gradients (the training path and the gradient checks); {totals['rows']} rows"
    )
    print(
        f"  {totals['projected']} of the {totals['tokens']} input positions projected to the vocabulary"
        f" (the others' logits were not asked for: logits_to_keep); {result.environment.get('logits_to_keep')}"
    )


def print_check_counts(by_check: dict[str, collections.Counter], top: int = 12) -> None:
    """The checks that ask the most forwards, every path together (a suite's forwards outside
    its checks, its set-up and probes, under the suite's name)."""
    total = sum(c["forwards"] for c in by_check.values()) or 1
    print(f"\n  the {top} checks with the most forwards (every path; share of all forwards)")
    for name, tally in sorted(by_check.items(), key=lambda item: -item[1]["forwards"])[:top]:
        share = tally["forwards"] / total
        print(f"  {name:<34} {tally['forwards']:>6} forwards {tally['tokens']:>8} tokens  {share:6.1%}")


def scaling(profile: str) -> None:
    """What the audit asks of a GPT-2 against its context length (counted on the narrow shape
    with that many positions), and what it costs against model size: each size's forward
    cost fitted on this machine, times the forwards and tokens counted. An estimate from
    the fit, not a timed audit: it shows how the cost grows (every token priced as if its
    logits were computed, a little above what the positions left out cost)."""
    counted = {}
    print(f"profile {profile}: forwards and input tokens against the context length (GPT-2 vocabulary)")
    for positions in SCALING_CONTEXTS:
        tallies, _ = count(gpt2_shape(64, 1, 4, positions), profile)
        total = sum(tallies.values(), collections.Counter())
        counted[positions] = total
        print(
            f"  context {positions:>5}: {total['forwards']:>6} forwards {total['tokens']:>8} tokens"
            f" ({total['projected']} projected to the vocabulary)",
            flush=True,
        )
    total = counted[1024]
    print(f"\nthe same audit against model size at context 1024, {torch.get_num_threads()} thread(s):")
    print(f"  {'model':<20} {'parameters':>11} {'ms a forward':>13} {'ms a token':>11} {'estimated s':>12}")
    for name, width, layers, heads in GPT2_SIZES:
        model = gpt2_shape(width, layers, heads)
        _, fixed, per_token = forward_cost(model, repeats=2)
        seconds = fixed * total["forwards"] + per_token * total["tokens"]
        parameters = sum(p.numel() for p in model.parameters()) / 1e6
        print(f"  {name:<20} {parameters:>10.0f}M {1000 * fixed:>13.1f} {1000 * per_token:>11.2f} {seconds:>12.0f}")


def measure(
    name: str,
    profile: str,
    repeats: int,
    with_breakdown: bool = False,
    device: str = "cpu",
    dtype: str = "float32",
    peer: str | None = None,
    threads: int = 1,
    unbatched: bool = False,
) -> dict[str, Any]:
    model = MODELS[name]().to(device=device, dtype=getattr(torch, dtype))
    parameters = sum(p.numel() for p in model.parameters())
    # The recorded audit, untimed, is also the warm-up: first calls allocate and pick kernels.
    recorder = Recorder(model)
    _, _, recorded = run_audit(model, profile, recorder)
    recorder.remove()
    audits, bares, peers, wholes, alone = [], [], [], [], []
    for _ in range(repeats):  # the runs alternate, so a slow moment of the machine falls on all of them
        if peer is not None:  # both sides as whole processes, what a user waits for
            peers.append(peer_run(peer, threads))
            wholes.append(audit_process(profile, threads))
        if unbatched:
            seconds, _, unbatched_result = run_audit(model, profile, batch_cases=False)
            alone.append(seconds)
            assert [s.status for s in unbatched_result.suites] == [s.status for s in recorded.suites], (
                "one case per forward gave other verdicts"
            )
        seconds, suite_seconds, result = run_audit(model, profile)
        audits.append((seconds, suite_seconds))
        bares.append(replay(recorder.calls))
    assert [s.status for s in result.suites] == [s.status for s in recorded.suites], "the timed run drew other cases"
    audit_time, bare_time = statistics.median(a for a, _ in audits), statistics.median(sum(b.values()) for b in bares)
    per_suite = {}
    gate_forwards = sum(1 for call in recorder.calls if call.suite == GATE)
    if gate_forwards:  # padding/batch_composition, run before the suites (harness.audits.runner.batching_gate)
        per_suite[GATE] = {
            "status": next(c.status for c in recorded.suite("padding").checks if c.name == "batch_composition"),
            "cases": 0,
            "forwards": gate_forwards,
            "audit": statistics.median(seconds.get(GATE, 0.0) for _, seconds in audits),
            "bare": statistics.median(b.get(GATE, 0.0) for b in bares),
        }
    for suite in recorded.suites:
        per_suite[suite.name] = {
            "status": suite.status,
            "cases": suite.cases,
            "forwards": sum(1 for call in recorder.calls if call.suite == suite.name),
            "audit": statistics.median(seconds.get(suite.name, 0.0) for _, seconds in audits),
            "bare": statistics.median(b.get(suite.name, 0.0) for b in bares),
        }
    return {
        "model": name,
        "parameters": parameters,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "forwards": len(recorder.calls),
        "with_grad": sum(call.grad for call in recorder.calls),
        "backward": sum(call.backward for call in recorder.calls),
        "audit": audit_time,
        "bare": bare_time,
        "ratio": audit_time / bare_time,
        "batching": recorded.environment.get("batching"),
        "unbatched": statistics.median(alone) if alone else None,
        "versus_peer": medians(wholes, peers) if peers else None,
        "per_suite": per_suite,
        "breakdown": breakdown(model, profile) if with_breakdown else None,
    }


def print_measured(name: str, r: dict[str, Any], args: argparse.Namespace) -> None:
    """One model's line of the overhead benchmark: per suite, the ratio, and what ran beside it."""
    where = (
        f"{args.device} {args.dtype}"
        if (args.device, args.dtype) != ("cpu", "float32")
        else f"{args.threads} thread(s)"
    )
    print(
        f"\n{name} ({r['parameters'] / 1e6:.1f}M parameters), profile {args.profile}, torch {torch.__version__}, {where}"
    )
    print(f"  {'suite':<16} {'status':<15} {'cases':>6} {'forwards':>9} {'per case':>9} {'audit s':>8} {'bare s':>8}")
    for suite, row in r["per_suite"].items():
        per_case = f"{row['forwards'] / row['cases']:.2f}" if row["cases"] else "-"
        print(
            f"  {suite:<16} {row['status']:<15} {row['cases']:>6} {row['forwards']:>9} {per_case:>9} {row['audit']:>8.2f} {row['bare']:>8.2f}"
        )
    print(
        f"  audit wall time {r['audit']:.2f}s; the same {r['forwards']} forwards ({r['with_grad']} with gradients,"
        f" {r['backward']} of them with their backward) on the bare model {r['bare']:.2f}s"
    )
    print(f"  audit time / bare model time = {r['ratio']:.3f}  (target <= 1.3)")
    print(f"  batching {r['batching']}")
    if r["unbatched"]:
        print(
            f"  the same audit with one case per forward (batch_cases=False): {r['unbatched']:.2f}s, {r['unbatched'] / r['audit']:.2f}x the batched audit's time"
        )
    if r["versus_peer"]:
        print_comparison(r["versus_peer"])
    if r["breakdown"]:
        print(f"\n  where an instrumented audit's time goes, ms:\n  {'suite':<16} {'forwards':>9} {'the rest':>9}")
        for suite, seconds in r["breakdown"].items():
            print(f"  {suite:<16} " + " ".join(f"{1000 * x:>9.1f}" for x in seconds))
        totals = [1000 * sum(column) for column in zip(*r["breakdown"].values())]
        print(f"  {'all':<16} " + " ".join(f"{x:>9.1f}" for x in totals))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="both", choices=[*COUNTED, "both"])
    parser.add_argument("--profile", default="ci", choices=PROFILE_NAMES)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs; the median is reported (default: 3)")
    parser.add_argument(
        "--breakdown",
        action="store_true",
        help="also split each suite's time into forwards, harness and Hypothesis (one more audit)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default: 1, as a pytest-xdist worker; 2 = this machine's cores)",
    )
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="the model's compute dtype (default: float32)",
    )
    parser.add_argument(
        "--peer",
        metavar="PYTHON",
        help="the python of a venv with pytest-torch (benchmarks/setup_peer.sh makes one): time its zero-code run on gpt2-small against the audit, both as whole processes, alternating with the timed audits",
    )
    parser.add_argument(
        "--unbatched",
        action="store_true",
        help="also time the audit with one case per forward (batch_cases=False), alternating",
    )
    parser.add_argument(
        "--forward-cost",
        action="store_true",
        help="only time bare forwards of gpt2-small at the audit's shapes and fit fixed + per-token cost",
    )
    parser.add_argument(
        "--peer-only",
        action="store_true",
        help="with --peer: only the audit and the peer's run, alternating (no recording, replay or unbatched audit)",
    )
    parser.add_argument(
        "--count",
        action="store_true",
        help="only count one audit's forwards and tokens by suite and call path (no timing; gpt2-narrow draws gpt2-small's cases)",
    )
    parser.add_argument(
        "--examples",
        type=int,
        metavar="N",
        help="with --count or --peer-only: cases a check draws instead of the profile's",
    )
    parser.add_argument(
        "--scaling",
        action="store_true",
        help="only count the audit against context length and estimate its cost against model size (fitted forward cost x counts)",
    )
    args = parser.parse_args()
    if args.examples is not None and (not (args.count or args.peer_only) or args.examples < 1):
        parser.error("--examples takes a positive count and goes with --count or --peer-only")
    torch.set_num_threads(args.threads)
    if args.scaling:
        scaling(args.profile)
        return 0
    if args.count:
        for name in list(MODELS) if args.model == "both" else [args.model]:
            by_check: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
            by_kind: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
            counts, result = count(
                COUNTED[name]().to(device=args.device, dtype=getattr(torch, args.dtype)),
                args.profile,
                examples=args.examples,
                by_check=by_check,
                by_kind=by_kind,
            )
            print_counts(
                name,
                args.profile if args.examples is None else f"{args.profile}, {args.examples} cases a check",
                counts,
                result,
            )
            print_check_counts(by_check)
            print_kind_counts(by_kind)
        return 0
    if args.model == "gpt2-narrow":
        parser.error("gpt2-narrow is for --count: it has gpt2-small's cases, not its cost")
    if args.peer:
        # the peer runs in a folder of its own: a relative path must not change meaning there
        args.peer = os.path.abspath(args.peer)
        if not os.access(args.peer, os.X_OK):
            parser.error(f"--peer {args.peer}: no such python (benchmarks/setup_peer.sh makes one)")
    if args.peer_only:
        if not args.peer:
            parser.error("--peer-only needs --peer PYTHON")
        print_versus_peer(args)
        return 0
    if args.forward_cost:
        model = gpt2_small().to(device=args.device, dtype=getattr(torch, args.dtype))
        timings, fixed, per_token = forward_cost(model)
        print(f"gpt2-small forward cost, {args.device} {args.dtype}, {args.threads} thread(s):")
        for rows, length, seconds in timings:
            print(f"  {rows:>3} x {length:<3} ({rows * length:>4} tokens): {1000 * seconds:8.1f} ms")
        print(
            f"  fit: {1000 * fixed:.1f} ms a forward + {1000 * per_token:.2f} ms a token: a forward costs as much as {fixed / per_token:.0f} tokens"
        )
        return 0
    names = list(MODELS) if args.model == "both" else [args.model]
    ok = True
    for name in names:
        peer = args.peer if name == "gpt2-small" else None
        r = measure(
            name,
            args.profile,
            args.repeats,
            args.breakdown,
            args.device,
            args.dtype,
            peer,
            args.threads,
            args.unbatched,
        )
        print_measured(name, r, args)
        ok &= r["ratio"] <= 1.3
    if args.model == "both" and args.peer:  # the whole benchmark in one run: the growth too
        print()
        scaling(args.profile)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
