"""Audit every architecture of the installed transformers, shrunk and random-init.

    python scripts/sweep/architecture_sweep.py                       # causal-LM types, default + eager attention
    python scripts/sweep/architecture_sweep.py --task all            # then masked-LM, seq2seq and classifier types
    python scripts/sweep/architecture_sweep.py --types gpt2,llama    # a few types
    python scripts/sweep/architecture_sweep.py --render              # docs/architectures.md from the results
    python scripts/sweep/architecture_sweep.py --task all --suites serving   # add a suite to every record

Each (type, attention implementation) is audited in its own subprocess with one torch
thread and a time limit, so one type that hangs or crashes costs only itself. Results
are JSON lines in docs/architectures.jsonl, one per audit; a rerun skips what is there
(delete lines, or pass --again, to redo them). The config each type was built with is
recorded, so scripts/sweep/reproduce_finding.py can rebuild the same model with plain
transformers calls.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from maskcheck.harness.engine.profile_names import PROFILE_NAMES

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "architectures.jsonl"
TASKS = ("causal-lm", "masked-lm", "seq2seq", "sequence-classification", "token-classification")
MEMORY_LIMIT = 8 * 2**30  # bytes of address space for one audit's process


def audit_one(
    model_type: str, task: str, implementation: str, profile: str, suites: Sequence[str] | None = None
) -> dict[str, Any]:
    """One audit, in this process: the record the sweep writes."""
    import torch
    import transformers
    from confirm_findings import sweep_suites

    from maskcheck import audit
    from maskcheck.harness.adapters.hf import HFAdapter
    from maskcheck.reference_models.hf_tiny import (
        SHRINK_LEVELS,
        shrunk_config,
        shrunk_model,
    )

    torch.set_num_threads(1)
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))  # a type that explodes fails alone, fast
    record: dict[str, Any] = {
        "type": model_type,
        "task": task,
        "implementation": implementation,
        "transformers": transformers.__version__,
    }
    started = time.perf_counter()
    errors = []
    for level in SHRINK_LEVELS:  # the smallest config whose plain forward runs
        try:
            config = shrunk_config(model_type, level, task)
            model = shrunk_model(model_type, task, None if implementation == "default" else implementation, level=level)
            runs_forward(model, task)
            break
        except Exception as exc:  # noqa: BLE001 - a type that does not build is a result of the sweep
            errors.append(f"{level} shrink: {type(exc).__name__}: {first_line(exc)}")
    else:
        record.update(built=False, error="; ".join(errors), seconds=round(time.perf_counter() - started, 2))
        return record
    record.update(
        built=True, shrink=level, config=config.to_dict()
    )  # whole: a default that depends on another field (layer lists) must not come back wrong
    record["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
    try:
        result = audit(HFAdapter(model, f"hf-type:{model_type}", task=task), suites or sweep_suites(), profile=profile)
    except Exception as exc:  # noqa: BLE001
        record.update(error=f"{type(exc).__name__}: {first_line(exc)}", seconds=round(time.perf_counter() - started, 2))
        return record
    record["suites"] = {suite.name: suite_record(suite) for suite in result.suites}
    record["seconds"] = round(time.perf_counter() - started, 2)
    return record


def runs_forward(model: Any, task: str) -> None:
    """A plain forward of two rows of four tokens, one left-padded, ids up to the output
    vocabulary's last (what the suites feed): a shrunk config that cannot run it is the
    shrink's failure (special-token ids beyond the shrunk vocabulary, widths that no longer
    divide), never reported as the model's."""
    import torch

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    vocab = int(head.weight.shape[0]) if head is not None and hasattr(head, "weight") else 128
    ids = torch.tensor([[3, 4, 5, vocab - 1], [0, 0, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    inputs = {"input_ids": ids, "attention_mask": mask}
    if task == "seq2seq":
        inputs["decoder_input_ids"] = ids
    with torch.inference_mode():
        model(**inputs)


def suite_record(suite: Any) -> dict[str, Any]:
    check = suite.worst_check()
    return {
        "status": suite.status,
        "check": check.name if check else None,
        "message": check.message if check and suite.status != "pass" else "",
        "max_diff": check.max_diff if check else None,
        "threshold": check.threshold if check else None,
        "case": check.case if check else None,
    }


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def done(path: Path) -> set[tuple[str, str, str]]:
    if not path.is_file():
        return set()
    keys = set()
    for line in path.read_text().splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        keys.add((data["type"], data["task"], data["implementation"]))
    return keys


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.startswith("{")]


def add_suites(args: argparse.Namespace, suites: list[str]) -> int:
    """Audit ``suites`` alone on every built record that lacks them (all with --again) and
    merge their verdicts into it; the file is rewritten after each audit, so an interrupted
    run keeps what it did."""
    records = read_records(args.out)
    tasks = TASKS if args.task == "all" else (args.task,)
    implementations = [i.strip() for i in args.implementations.split(",") if i.strip()]
    plan = [
        index
        for index, r in enumerate(records)
        if r.get("built") and "suites" in r and r["task"] in tasks and r["implementation"] in implementations
        if not args.types or r["type"] in args.types.split(",")
        if args.again or not all(name in r["suites"] for name in suites)
    ]
    print(f"sweep: adding {','.join(suites)} to {len(plan)} records of {args.out}", file=sys.stderr)
    started = time.perf_counter()
    for done_count, index in enumerate(plan, 1):
        record = records[index]
        fresh = run_isolated(
            record["type"], record["task"], record["implementation"], args.profile, args.timeout, suites
        )
        if "suites" in fresh:
            record["suites"].update(fresh["suites"])
            record.setdefault("added_seconds", {})[",".join(suites)] = fresh.get("seconds")
        else:  # the audit of these suites failed: recorded as each suite's error
            message = fresh.get("error", "no result")
            empty = {"check": None, "max_diff": None, "threshold": None, "case": None}
            record["suites"].update({name: {"status": "error", **empty, "message": message} for name in suites})
        args.out.write_text("".join(json.dumps(r, default=str) + "\n" for r in records))
        statuses = " ".join(f"{k}={record['suites'][k]['status']}" for k in suites)
        elapsed = time.perf_counter() - started
        print(
            f"[{done_count}/{len(plan)} {elapsed / 60:.1f} min] {record['task']} {record['type']} "
            f"{record['implementation']}: {statuses[:160]}",
            file=sys.stderr,
            flush=True,
        )
    return 0


def sweep(args: argparse.Namespace) -> int:
    from maskcheck.reference_models.hf_tiny import model_types

    if args.suites:
        return add_suites(args, [name.strip() for name in args.suites.split(",") if name.strip()])

    tasks = TASKS if args.task == "all" else (args.task,)
    implementations = [i.strip() for i in args.implementations.split(",") if i.strip()]
    finished = set() if args.again else done(args.out)
    plan = [
        (model_type, task, implementation)
        for task in tasks
        for model_type in model_types(task)
        if not args.types or model_type in args.types.split(",")  # a type outside a task's mapping has no audit there
        for implementation in implementations
        if (model_type, task, implementation) not in finished
    ]
    print(f"sweep: {len(plan)} audits to run ({len(finished)} already in {args.out})", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for index, (model_type, task, implementation) in enumerate(plan, 1):
        record = run_isolated(model_type, task, implementation, args.profile, args.timeout)
        with args.out.open("a") as out:
            out.write(json.dumps(record, default=str) + "\n")
        statuses = " ".join(f"{k}={v['status']}" for k, v in record.get("suites", {}).items()) or record.get(
            "error", ""
        )
        elapsed = time.perf_counter() - started
        print(
            f"[{index}/{len(plan)} {elapsed / 60:.1f} min] {task} {model_type} {implementation}: {statuses[:160]}",
            file=sys.stderr,
            flush=True,
        )
    return 0


def run_isolated(
    model_type: str, task: str, implementation: str, profile: str, timeout: float, suites: Sequence[str] = ()
) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--one",
        model_type,
        "--task",
        task,
        "--implementations",
        implementation,
        "--profile",
        profile,
    ]
    if suites:
        command += ["--suites", ",".join(suites)]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore"}
    record = {"type": model_type, "task": task, "implementation": implementation}
    try:
        completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment)
    except subprocess.TimeoutExpired:
        return {**record, "error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in completed.stdout.splitlines() if line.startswith("{")]
    if completed.returncode != 0 or not lines:
        tail = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        return {**record, "error": f"the audit process exited {completed.returncode}: {tail[:300]}"}
    return json.loads(lines[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--task", default="causal-lm", choices=[*TASKS, "all"])
    parser.add_argument("--types", help="comma-separated model types (default: every type of the task's auto mapping)")
    parser.add_argument(
        "--implementations",
        default="default,eager",
        help="attention implementations, 'default' = the model's own (default: default,eager)",
    )
    parser.add_argument("--profile", default="ci", choices=PROFILE_NAMES)
    parser.add_argument("--timeout", type=float, default=180, help="seconds per audit (default: 180)")
    parser.add_argument("--out", type=Path, default=RESULTS, help=f"JSON lines (default: {RESULTS.relative_to(ROOT)})")
    parser.add_argument("--again", action="store_true", help="rerun audits already in the results")
    parser.add_argument(
        "--suites", help="audit only these suites (comma-separated) and merge them into the records already there"
    )
    parser.add_argument("--render", action="store_true", help="write docs/architectures.md from the results and stop")
    parser.add_argument("--one", metavar="TYPE", help=argparse.SUPPRESS)  # the subprocess of one audit
    args = parser.parse_args()
    if args.one:
        suites = args.suites.split(",") if args.suites else None
        print(json.dumps(audit_one(args.one, args.task, args.implementations, args.profile, suites), default=str))
        return 0
    if args.render:
        from render_architectures import render

        render(args.out, ROOT / "docs" / "architectures.md")
        return 0
    return sweep(args)


if __name__ == "__main__":
    raise SystemExit(main())
