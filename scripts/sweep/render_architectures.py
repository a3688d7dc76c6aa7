"""docs/architectures.md from the sweep's JSON lines (scripts/sweep/architecture_sweep.py --render)."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Callable

# this folder is on the path of every script run from it
from confirm_findings import REPRODUCIBLE, verdict_label

from maskcheck.harness.engine.registry import suite_names

SUITES = tuple(suite_names())  # every suite, in run order, for the findings' lists
TABLE_SUITES = REPRODUCIBLE  # the suites the sweep audits (Suite.in_sweep), one column each
MARK = {"pass": "pass", "warn": "WARN", "fail": "FAIL", "error": "ERROR", "not_applicable": "n/a", "not_run": "NOT RUN"}


def latest(path: Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    """The last record of each (type, task, implementation): a rerun replaces an earlier one."""
    records = {}
    for line in path.read_text().splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        records[(data["type"], data["task"], data["implementation"])] = data
    return records


def cell(records: list[dict[str, Any]], suite: str) -> str:
    marks = [MARK.get(r.get("suites", {}).get(suite, {}).get("status", ""), "") for r in records]
    return marks[0] if len(set(marks)) == 1 else " / ".join(marks)


def confirmations(
    path: Path, records: dict[tuple[str, str, str], dict[str, Any]]
) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    """scripts/sweep/confirm_findings.py's last result per (type, task, suite, implementation), where
    it confirms the verdict ``records`` holds now (one made for an earlier verdict is stale)."""
    if not path.is_file():
        return {}
    last = {
        (r["type"], r["task"], r["suite"], r.get("implementation", "default")): r
        for r in map(json.loads, path.read_text().splitlines())
    }
    current = {}
    for (model_type, task, suite, implementation), confirmation in last.items():
        record = records.get((model_type, task, implementation), {})
        if suite in record.get("suites", {}) and confirmation.get("verdict") == verdict_label(record, suite):
            current[(model_type, task, suite, implementation)] = confirmation
    return current


def measured(record: dict[str, Any]) -> str:
    """The direct check's difference, and whether float64 decided it (a small difference)."""
    remeasured = (
        " (the same in float64: not rounding)"
        if "(float64;" in record.get("output", "") and record["confirmed"]
        else ""
    )
    return f"{record['difference']:.3g}{remeasured}"


def confirmation_note(record: dict[str, Any] | None) -> str:
    if record is None:
        return " Not reproduced yet."
    if record["confirmed"] is None:
        return f" The direct check could not run ({record['output']})."
    if record["confirmed"]:
        return f" Confirmed with plain transformers: max |difference| {measured(record)}."
    return f" **Not confirmed**: the direct check measures {record['difference']:.3g}."


def warn_note(record: dict[str, Any]) -> str:
    """What the direct check measured for a WARN: the behaviour it describes, shown or not."""
    if record["confirmed"] is None:
        return f" The direct check could not run ({record['output']})."
    if record["confirmed"]:
        return f" The behaviour shows with plain transformers: max |difference| {measured(record)}."
    return f" The direct check does not show it (max |difference| {record['difference']:.3g}): the warning rests on maskcheck's measurement alone."


def verdict_keys(
    built: dict[tuple[str, str], list[dict[str, Any]]], wanted: Callable[[str, dict[str, Any]], bool]
) -> list[tuple[str, str, str, str]]:
    """(type, task, suite, implementation) of every verdict ``wanted(suite, verdict)`` picks."""
    return [
        (t, task, suite, r["implementation"])
        for (t, task), rs in built.items()
        for r in rs
        for suite, data in r["suites"].items()
        if wanted(suite, data)
    ]


def measured_warn(suite: str, data: dict[str, Any]) -> bool:
    """A WARN whose behaviour confirm_findings.py --warnings measures (every reproducible suite's)."""
    return suite in REPRODUCIBLE and data["status"] == "warn"


def warn_tally(
    built: dict[tuple[str, str], list[dict[str, Any]]], confirmed: dict[tuple[str, str, str, str], dict[str, Any]]
) -> str:
    """One line: how many WARNs the direct checks measured, and what they showed."""
    keys = verdict_keys(built, measured_warn)
    found = [confirmed[key] for key in keys if key in confirmed]
    shown = sum(1 for r in found if r["confirmed"])
    return (
        f"Of {len(keys)} WARN verdicts in reproducible suites, {len(found)} were measured by a direct check of their behaviour: "
        f"{shown} show the behaviour with plain transformers, {sum(1 for r in found if r['confirmed'] is False)} do not, "
        f"{sum(1 for r in found if r['confirmed'] is None)} could not run."
    )


def tally(
    built: dict[tuple[str, str], list[dict[str, Any]]], confirmed: dict[tuple[str, str, str, str], dict[str, Any]]
) -> str:
    """One line: how many reproducible FAILs (every implementation) the direct checks confirmed."""
    keys = verdict_keys(built, lambda suite, data: suite in REPRODUCIBLE and data["status"] == "fail")
    found = [confirmed.get(key) for key in keys]
    yes = sum(1 for r in found if r and r["confirmed"])
    no = sum(1 for r in found if r and r["confirmed"] is False)
    missing = len(keys) - yes - no
    return f"Of {len(keys)} FAIL verdicts in reproducible suites, {yes} are confirmed by their direct check, {no} are not, {missing} not reproduced or the check could not run."


def render(results: Path, out: Path) -> None:
    records = latest(results)
    confirmed = confirmations(results.with_name("architectures-confirmed.jsonl"), records)
    by_type: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for (model_type, task, _), record in sorted(records.items()):
        by_type[(model_type, task)].append(record)
    implementations = sorted({impl for _, _, impl in records}, key=lambda i: (i != "default", i))
    versions = sorted({r.get("transformers", "?") for r in records.values() if r.get("transformers")})
    built = {key: rs for key, rs in by_type.items() if all(r.get("built") and "suites" in r for r in rs)}
    hours = sum(r.get("seconds", 0) for r in records.values()) / 3600
    lines = [
        "# Every architecture of transformers, audited",
        "",
        "Generated by `python scripts/sweep/architecture_sweep.py --render` from `docs/architectures.jsonl`;",
        "do not edit by hand. Each model type of the installed transformers' auto mappings is built",
        "random-init from its default config shrunk to two layers, width 64 and vocabulary 128 (a",
        "default sliding window shrunk to 6), audited with the `ci` profile on the CPU, one torch",
        f"thread, once per attention implementation ({', '.join(implementations)}; `default` is the",
        "model's own). Types whose widths or layer pattern the generic shrink cannot derive (state-space",
        "hybrids, multi-head latent attention, GPT-J's rotary width) take a per-type override",
        "(`SWEEP_OVERRIDES`, `TASK_OVERRIDES` and `MLA_WIDTHS` in `reference_models/hf_tiny.py`); where the full shrink",
        "still breaks a type's widths, only its counts (layers, experts, vocabulary) are shrunk; a type",
        "whose plain forward no shrink can run is listed as not built. A cell with two verdicts reads",
        "default / eager.",
        "",
        f"transformers {', '.join(versions)}; {len(built)} of {len(by_type)} types audited; audit time {hours:.1f} h of one core.",
        "",
        "Every finding names a plain-transformers reproduction, `scripts/sweep/reproduce_finding.py TYPE",
        "SUITE`, which rebuilds the same model and measures the property with no maskcheck code;",
        "`python scripts/sweep/confirm_findings.py` runs it for every FAIL and records the result in",
        "`docs/architectures-confirmed.jsonl`, and each FAIL below says what it measured. A",
        "difference across shapes counts above 1e-4 in float32; one between zero and 1e-4 is",
        "measured again in float64 and counts only if it keeps its size there (rounding shrinks",
        "2**29-fold, a behaviour does not; the script's docstring has the rule).",
        f"{tally(built, confirmed)}",
        "`--warnings` measures the behaviour each WARN describes the same way: left padding that",
        "shifts positions with the suite's own direct check, a model that does not derive positions",
        "from the mask with `positions`, packing that leaks without isolating inputs with",
        "`packing_unisolated`, a left-padded source that shifts an encoder's positions with",
        "`source_positions`; each WARN below names its direct check and says what it showed.",
        "Position ids a direct check passes start where the model's own do (measured: RoBERTa-style",
        "models count from `padding_idx + 1`).",
        f"{warn_tally(built, confirmed)}",
        "",
        "How to read the verdicts: a `WARN` is a real behaviour that is not a leak, with its",
        "reason (left padding on a model without position ids, packing that is safe only with",
        "the documented inputs, a documented label convention from `harness/audits/conventions.json`);",
        "`n/a` says why the input cannot be given (the table at the end); `NOT RUN` names what a",
        "suite could not verify (a declared window beside layer types maskcheck does not verify);",
        "`kv_cache` decodes each",
        "model the way `generate()` does, with the model's own generation methods, so recurrent",
        "and state-space caches (`state`, Mamba's cache) are checked on the path users run; where",
        "`generate()` feeds other inputs than the prompt (XLM, XLNet, OpenAI-GPT, CPM-Ant) it compares",
        "`generate()` with its cache against `generate()` without (`generate_use_cache`).",
        "`serving` (rollback, row reorders, reuse, a shared prompt cache, eviction, the static cache)",
        "was swept on the default attention implementation only (an empty cell: not swept); a",
        "`serving` FAIL whose decode was wrong without the operation too is the `kv_cache` finding",
        "again, and is confirmed by `kv_cache`'s direct check.",
        "The sequence- and token-classification heads (tasks `sequence-classification`,",
        "`token-classification`) were swept on the default attention implementation only, each",
        "config given a pad id where it has none, as fine-tuning gives it. A sequence classifier",
        "returns one score per row: its padding verdict judges that pooled output, and `padding/pooling`",
        "names what decides it; its FAILs are reproduced by `pooling` (neither padding side gives the",
        "row alone), `pooling_right`/`pooling_left` (that side) and `pooling_ids_right`/`pooling_ids_left`",
        "(other ids in the padded slots). Encoder-decoder classifiers (BART, T5) are not audited yet and",
        "are listed as not built.",
        *(
            ["Only the default attention implementation has been swept with this version."]
            if implementations == ["default"]
            else []
        ),
        "",
        "| type | task | " + " | ".join(TABLE_SUITES) + " |",
        "|---|---|" + "---|" * len(TABLE_SUITES),
    ]
    for (model_type, task), rs in sorted(built.items()):
        lines.append(f"| {model_type} | {task} | " + " | ".join(cell(rs, s) for s in TABLE_SUITES) + " |")
    lines += [
        "",
        "## Findings",
        "",
        "Every verdict other than pass and not applicable, with its measurement and reproduction.",
        "",
    ]
    for (model_type, task), rs in sorted(built.items()):
        for record in rs:
            for suite in SUITES:
                data = record["suites"].get(suite)
                if not data or data["status"] in ("pass", "not_applicable"):
                    continue
                size = (
                    f" (measured {data['max_diff']:.3g}, threshold {data['threshold']:.3g})"
                    if data.get("max_diff") is not None and data.get("threshold")
                    else ""
                )
                message = " ".join(data["message"].split())
                message = message if len(message) <= 300 else message[:297] + "..."
                impl = "" if record["implementation"] == "default" else f" --implementation {record['implementation']}"
                task_flag = "" if task == "causal-lm" else f" --task {task}"
                measured = confirmed.get((model_type, task, suite, record["implementation"]))
                check = (
                    measured.get("check", suite) if measured else suite
                )  # a WARN's behaviour has a direct check of its own
                reproduce = (
                    f" Reproduce: `python scripts/sweep/reproduce_finding.py {model_type} {check}{task_flag}{impl}`."
                    if suite in REPRODUCIBLE and data["status"] != "not_run"  # nothing was measured to reproduce
                    else ""
                )
                if suite in REPRODUCIBLE and data["status"] == "fail":
                    reproduce += confirmation_note(measured)
                elif measured_warn(suite, data) and measured is not None:
                    reproduce += warn_note(measured)
                lines.append(
                    f"- **{model_type}** {suite} ({record['implementation']}): {MARK[data['status']]} {data['check']}{size}: {message}.{reproduce}"
                )
    lines += ["", "## Not applicable", "", "| suite | reason | types |", "|---|---|---|"]
    reasons: Counter[tuple[str, str]] = Counter()
    for rs in built.values():
        for suite in SUITES:
            data = rs[0]["suites"].get(suite)
            if data and data["status"] == "not_applicable":
                reasons[(suite, " ".join(data["message"].split()) or "not applicable")] += 1
    for (suite, reason), count in sorted(reasons.items()):
        lines.append(f"| {suite} | {reason} | {count} |")
    lines += ["", "## Not built", ""]
    for (model_type, task), rs in sorted(by_type.items()):
        if (model_type, task) not in built:
            error = next((r.get("error") for r in rs if r.get("error")), "no result")
            lines.append(f"- **{model_type}** ({task}): {error}")
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}: {len(built)} types audited, {len(by_type) - len(built)} not built")
