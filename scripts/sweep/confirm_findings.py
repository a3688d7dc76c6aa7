"""Run the plain-transformers reproduction of every FAIL the architecture sweep recorded.

    python scripts/sweep/confirm_findings.py            # every FAIL not confirmed yet (or whose verdict changed since)
    python scripts/sweep/confirm_findings.py --again    # all of them again
    python scripts/sweep/confirm_findings.py --warnings # WARNs too: the behaviour each describes, measured directly
    python scripts/sweep/confirm_findings.py --again --warnings --type roberta --type mra  # some types again

Each FAIL in docs/architectures.jsonl (suites causal, padding, packing, kv_cache,
loss_masking, cross_attention) is reproduced by `scripts/sweep/reproduce_finding.py TYPE SUITE` in its own
subprocess (no maskcheck code runs there) and the result goes to
docs/architectures-confirmed.jsonl: the largest difference the direct check measured and
whether the property failed (the script's exit status 1). `--render` of the sweep then marks every finding confirmed or not:
a FAIL the direct check does not show is a harness false alarm until shown otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "architectures.jsonl"
CONFIRMED = ROOT / "docs" / "architectures-confirmed.jsonl"


def sweep_suites() -> tuple[str, ...]:
    """The suites the sweep audits, each of whose verdicts reproduce_finding.py checks with plain
    transformers: the suite classes say which (``Suite.in_sweep``), in run order."""
    from maskcheck.harness.engine.registry import suite_names

    return tuple(suite_names(lambda suite: suite.in_sweep))


REPRODUCIBLE = sweep_suites()
#: The direct check that measures a WARN's behaviour, by (suite, check): left padding that
#: shifts positions (padding, loss masking, cached decoding) has the suite's own check; a
#: model that does not derive positions from the mask, packing that leaks without the
#: inputs that isolate sequences (and not with them), a left-padded source that shifts positions, and influence that
#: stops short of the row's start (an undeclared window) have checks of their own.
WARN_CHECKS = {
    ("padding", "positions_from_mask"): "positions",
    ("cross_attention", "source_padding_amount"): "source_positions",
    ("causal", "declared_pattern"): "reach",
    ("packing", "settings"): "packing_unisolated",  # safe only with the isolating inputs
    ("packing", "no_packing_input"): "packing",  # no input isolates: the isolated path leaks too
    "padding": "padding",
    "loss_masking": "loss_masking",
    "kv_cache": "kv_cache",
}


#: a serving failure whose decode was already wrong without the operation: kv_cache's finding
CACHE_BEFORE_OPERATION = "the cache is wrong before any"
#: a causal failure of the cut rows (suites/causal.py:truncation), not of a changed id: its own direct check
READS_LENGTH = "a position reads how many tokens follow it"


def direct_check(suite: str, verdict: dict, task: str = "causal-lm") -> str | None:
    """The reproduce_finding.py check for a verdict: the suite's own for a FAIL (a serving
    FAIL the same decode without the operation shows too: kv_cache's, which it is; a causal
    FAIL of the cut rows: truncation); for a
    WARN, the one that measures its behaviour (None: no direct check measures it)."""
    if task == "token-classification" and suite == "loss_masking":  # labels are label indices, unshifted
        return "tagger_loss" if verdict["status"] == "fail" else None
    if task == "sequence-classification":  # one output per row: its padding is its pooled position's
        if suite != "padding" or verdict["status"] != "fail":
            return None
        message = verdict.get("message", "")
        if "reads padded slots" in message:  # pooling: neither side holds
            return "pooling"
        named = (side for side in ("right", "left") if f"{side} padding" in message or f"{side}-padded" in message)
        side = next(named, None)
        if side and verdict.get("check") == "pad_ids":  # same shapes: the padded ids changed
            return f"pooling_ids_{side}"
        return f"pooling_{side}" if side else "pooling"
    if verdict["status"] == "fail":
        if suite == "serving" and CACHE_BEFORE_OPERATION in verdict.get("message", ""):
            return "kv_cache"
        if suite == "causal" and READS_LENGTH in verdict.get("message", ""):
            return "truncation"
        return suite
    return WARN_CHECKS.get((suite, verdict.get("check")), WARN_CHECKS.get(suite))


DIFFERENCE = re.compile(r"max \|difference\| = ([0-9.eE+-]+|nan|inf)")


def verdict_label(record: dict, suite: str) -> str:
    """What a confirmation confirms: a verdict's status and check and the config it was
    audited with (``fail pad_ids 3f2a9c1e``). A confirmation of another label is stale: the
    sweep has changed the verdict, or the shrink the model, since."""
    data = record["suites"][suite]
    config = hashlib.sha256(json.dumps(record.get("config"), sort_keys=True, default=str).encode()).hexdigest()[:8]
    return f"{data['status']} {data.get('check')} {config}"


def failures(results: Path, statuses: tuple[str, ...] = ("fail",)) -> list[tuple[str, str, str, str, str, str]]:
    """(type, task, suite, attention implementation, direct check, verdict label) of every
    verdict of ``statuses`` in a reproducible suite that a direct check measures."""
    latest = {}
    for line in results.read_text().splitlines():
        record = json.loads(line)
        latest[(record["type"], record["task"], record["implementation"])] = record
    return sorted(
        (model_type, task, suite, implementation, check, verdict_label(record, suite))
        for (model_type, task, implementation), record in latest.items()
        for suite, data in record.get("suites", {}).items()
        if suite in REPRODUCIBLE
        and data["status"] in statuses
        and (check := direct_check(suite, data, task)) is not None
    )


def reproduce(
    model_type: str, task: str, suite: str, implementation: str, check: str, verdict: str, timeout: float
) -> dict:
    command = [
        sys.executable,
        str(Path(__file__).resolve().parent / "reproduce_finding.py"),
        model_type,
        check,
        "--task",
        task,
        "--implementation",
        implementation,
    ]
    record = {
        "type": model_type,
        "task": task,
        "suite": suite,
        "implementation": implementation,
        "check": check,
        "verdict": verdict,
    }
    try:
        completed = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"},
        )
    except subprocess.TimeoutExpired:
        return {**record, "difference": None, "confirmed": None, "output": f"timed out after {timeout:.0f} s"}
    found = DIFFERENCE.search(completed.stdout)
    if not found:
        tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        return {**record, "difference": None, "confirmed": None, "output": tail[:300]}
    difference = float(found.group(1))
    lines = [line for line in completed.stdout.splitlines() if line.strip()]
    # reproduce_finding.py exits 1 when the property does not hold (its own threshold per check)
    return {
        **record,
        "difference": difference,
        "confirmed": completed.returncode == 1,
        "output": " | ".join(lines[-3:])[:400],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--again", action="store_true")
    parser.add_argument(
        "--warnings",
        action="store_true",
        help="also measure every WARN's behaviour with its direct check (a real behaviour shows a difference)",
    )
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--implementation", help="only the verdicts of this attention implementation (default: all)")
    parser.add_argument(
        "--type", action="append", dest="types", metavar="TYPE", help="only this model type (repeatable; default: all)"
    )
    parser.add_argument(
        "--suite",
        action="append",
        dest="suites",
        choices=REPRODUCIBLE,
        help="only this suite's verdicts (repeatable; default: all)",
    )
    args = parser.parse_args()
    done = set()
    if CONFIRMED.is_file() and not args.again:
        done = {
            (r["type"], r["task"], r["suite"], r.get("implementation", "default"), r.get("verdict"))
            for r in map(json.loads, CONFIRMED.read_text().splitlines())
        }
    plan = [
        key
        for key in failures(RESULTS, ("fail", "warn") if args.warnings else ("fail",))
        if (*key[:4], key[5]) not in done
        and args.implementation in (None, key[3])
        and (not args.types or key[0] in args.types)
        and (not args.suites or key[2] in args.suites)
    ]
    print(f"confirm: {len(plan)} findings to reproduce", file=sys.stderr)
    for index, (model_type, task, suite, implementation, check, verdict) in enumerate(plan, 1):
        record = reproduce(model_type, task, suite, implementation, check, verdict, args.timeout)
        with CONFIRMED.open("a") as out:
            out.write(json.dumps(record) + "\n")
        verdict = {True: "confirmed", False: "NOT CONFIRMED", None: "could not run"}[record["confirmed"]]
        print(
            f"[{index}/{len(plan)}] {model_type} {task} {suite} ({implementation}): {verdict} ({record['difference']})",
            file=sys.stderr,
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
