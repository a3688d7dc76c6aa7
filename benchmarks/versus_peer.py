"""The ``ci`` audit of gpt2-small against the closest peer's zero-code run of the same model.

Both are timed as whole processes, what a user waits for: ``maskcheck audit`` of the
factory module, and pytest-torch's ``pytest --torch-model=MODULE:FACTORY`` in its own venv
(``benchmarks/setup_peer.sh``), alternating. ``benchmarks/audit_overhead.py --peer-only``
runs it.
"""

from __future__ import annotations

import argparse
import inspect
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from benchmark_models import gpt2_small


def peer_module() -> str:
    """A module defining ``gpt2_small`` for the peer's zero-code run: the same factory as ours."""
    return "from typing import Any\n\nimport torch\n\n\n" + inspect.getsource(gpt2_small)


def timed_process(command: list[str], threads: int) -> tuple[float, subprocess.CompletedProcess]:
    """Wall seconds of ``command`` run as a user runs it, in a folder holding the
    ``peer_models`` module (:func:`peer_module`), with ``threads`` torch threads; and what it printed."""
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "peer_models.py").write_text(peer_module())
        env = {**os.environ, "PYTHONPATH": folder, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
        started = time.perf_counter()
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
        return time.perf_counter() - started, done


def audit_process(profile: str, threads: int, examples: int | None = None) -> tuple[float, float, str]:
    """``maskcheck audit module:peer_models:gpt2_small`` as its own process, what a user waits
    for (the interpreter, the imports, the model's construction and the audit): wall seconds,
    the seconds the audit reports, and its verdict line. ``examples``: ``--examples``, the
    cases a check draws instead of the profile's."""
    command = [sys.executable, "-m", "maskcheck", "audit", "module:peer_models:gpt2_small", "--profile", profile, "-q"]
    if examples is not None:
        command += ["--examples", str(examples)]
    wall, done = timed_process(command, threads)
    verdict = next((line for line in done.stdout.splitlines() if line.startswith("verdict: ")), "")
    if not verdict or done.returncode not in (0, 1):
        raise SystemExit(f"the audit did not run (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    reported = float(verdict.split(" in ", 1)[1].split("s")[0])
    return wall, reported, verdict


def peer_run(python: str, threads: int) -> tuple[float, float, str]:
    """pytest-torch's zero-code run (``pytest --torch-model=MODULE:FACTORY``) on the GPT-2-small
    shape, in its own venv (it registers a pytest plugin) and process: wall seconds, the
    seconds pytest reports for its session, and pytest's summary line."""
    wall, done = timed_process(
        [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--torch-model=peer_models:gpt2_small"], threads
    )
    summary = next(
        (
            line.strip("= ")
            for line in reversed(done.stdout.splitlines())
            if " in " in line and ("passed" in line or "failed" in line)
        ),
        "",
    )
    if not summary or " error" in summary:  # a run whose tests could not run measures nothing
        raise SystemExit(
            f"the peer's run did not run its tests (exit {done.returncode}):\n"
            f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )
    reported = float(summary.rsplit(" in ", 1)[1].split("s")[0])
    return wall, reported, summary


def versus_peer(profile: str, repeats: int, peer: str, threads: int, examples: int | None = None) -> dict[str, Any]:
    """``maskcheck audit`` of gpt2-small (``examples`` cases a check, None: the profile's) and
    the peer's zero-code run on the same model, each a whole process, alternating, ``repeats``
    times each: medians of wall time and of what each reports, and the audit's verdict line."""
    audits, peers = [], []
    for _ in range(repeats):
        peers.append(peer_run(peer, threads))
        audits.append(audit_process(profile, threads, examples))
    return medians(audits, peers)


def medians(audits: list[tuple[float, float, str]], peers: list[tuple[float, float, str]]) -> dict[str, Any]:
    """What :func:`audit_process` and :func:`peer_run` returned, run after run: the medians
    of wall and reported seconds of each side, and the last run's verdict and summary lines."""
    return {
        "audit": {
            "wall": statistics.median(a[0] for a in audits),
            "reported": statistics.median(a[1] for a in audits),
            "verdict": audits[-1][2],
        },
        "peer": {
            "wall": statistics.median(p[0] for p in peers),
            "reported": statistics.median(p[1] for p in peers),
            "summary": peers[-1][2],
        },
    }


def print_comparison(r: dict[str, Any]) -> None:
    """The lines of :func:`medians`' result: each side, and the audit over the peer."""
    a, p = r["audit"], r["peer"]
    print(f"  maskcheck audit: {a['wall']:.2f}s with its process ({a['reported']:.2f}s as it reports); {a['verdict']}")
    print(
        f"  pytest-torch zero-code run on the same model: {p['wall']:.2f}s with its process "
        f"({p['reported']:.2f}s as pytest reports it); {p['summary']}"
    )
    print(f"  maskcheck audit / pytest-torch run, whole processes = {a['wall'] / p['wall']:.2f}  (target < 1)")


def print_versus_peer(args: argparse.Namespace) -> None:
    """``--peer-only``: the audit and the peer's zero-code run of gpt2-small, alternating;
    with ``--examples N``, the audit of N cases a check."""
    cases = "" if args.examples is None else f", {args.examples} case(s) a check"
    print(
        f"gpt2-small, profile {args.profile}{cases}, torch {torch.__version__}, {args.threads} thread(s), "
        f"whole processes, median of {args.repeats}, alternating"
    )
    print_comparison(versus_peer(args.profile, args.repeats, args.peer, args.threads, args.examples))
