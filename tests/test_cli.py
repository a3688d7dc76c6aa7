"""The audit CLI: configuration, reports, schema, known findings, time limits, help."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from maskcheck import audit
from maskcheck.harness.cli import build_parser, main
from maskcheck.harness.report.render import report_schema


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "spec,suites",
    [
        ("ref:tiny-decoder", None),
        ("mutant:padding_mask_ignored", ["padding", "kv_cache"]),
        ("ref:tiny-encoder-decoder", ["cross_attention", "packing", "norm_checkpoint"]),
    ],
)
def test_every_report_validates_against_the_shipped_schema(spec: str, suites: list[str] | None, tmp_path: Path) -> None:
    report = audit(spec, suites, bundle_dir=tmp_path).to_dict()
    jsonschema.validate(report, report_schema())


def test_error_and_nan_reports_validate_too() -> None:
    import torch

    from maskcheck.harness.adapters.base import Capabilities
    from maskcheck.harness.adapters.module import ModuleAdapter

    def nan_model(ids, mask):  # type: ignore[no-untyped-def]
        return torch.full((*ids.shape, 8), float("nan"))

    def raising(ids, mask):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    for forward in (nan_model, raising):
        report = audit(
            ModuleAdapter(forward, Capabilities(family="decoder", vocab_size=8), mask_convention="keep"),
            ["causal", "padding"],
        ).to_dict()
        jsonschema.validate(report, report_schema())
        json.dumps(report, allow_nan=False)  # strict JSON: raises on NaN or Infinity


def test_defaults_come_from_tool_maskcheck(project: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (project / "pyproject.toml").write_text(
        '[tool.maskcheck]\nsuites = "causal,padding"\nprofile = "ci"\nseed = 3\nreport = "out"\n'
    )
    assert main(["audit", "ref:tiny-decoder", "-q"]) == 0
    report = json.loads((project / "out" / "report.json").read_text())
    assert [s["name"] for s in report["suites"]] == ["causal", "padding"]
    assert report["environment"]["profile"] == "ci" and report["environment"]["seed"] == 3
    assert (project / "out" / "report.md").read_text().startswith("# maskcheck audit of `ref:tiny-decoder`")
    # The command line wins over the file.
    assert main(["audit", "ref:tiny-decoder", "-q", "--suites", "causal", "--seed", "4", "--report", "cli"]) == 0
    report = json.loads((project / "cli" / "report.json").read_text())
    assert [s["name"] for s in report["suites"]] == ["causal"] and report["environment"]["seed"] == 4


def test_malformed_configuration_is_one_line(project: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    (project / "pyproject.toml").write_text("[tool.maskcheck]\nsuites = 3\n")
    assert main(["audit", "ref:tiny-decoder"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "suites has the wrong type" in err
    # A key this version does not know (written for a newer maskcheck) is a warning, not an error.
    (project / "pyproject.toml").write_text('[tool.maskcheck]\nspeed = 3\nsuites = ["causal"]\n')
    with pytest.warns(UserWarning, match="key 'speed' is not known to this maskcheck and is ignored"):
        assert main(["audit", "ref:tiny-decoder", "-q"]) == 0


def test_known_findings_warn_until_they_expire(project: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    finding = '[[tool.maskcheck.known_findings]]\nmodel = "mutant:padding_*"\nsuite = "padding"\ncheck = "*"\nreason = "tracked upstream"\nexpires = {date}\n'
    (project / "pyproject.toml").write_text("[tool.maskcheck]\n" + finding.format(date="2999-01-01"))
    assert main(["audit", "mutant:padding_mask_ignored", "--suites", "padding", "-q", "--json", "r.json"]) == 0
    checks = json.loads((project / "r.json").read_text())["suites"][0]["checks"]
    assert all(c["status"] == "warn" for c in checks if c["name"] != "positions_from_mask")
    assert checks[0]["message"].startswith("accepted finding until 2999-01-01 (tracked upstream): changing the ids")
    (project / "pyproject.toml").write_text("[tool.maskcheck]\n" + finding.format(date="2001-01-01"))
    assert main(["audit", "mutant:padding_mask_ignored", "--suites", "padding", "-q", "--json", "r.json"]) == 1
    checks = json.loads((project / "r.json").read_text())["suites"][0]["checks"]
    assert checks[0]["status"] == "fail" and "expired on 2001-01-01" in checks[0]["message"]


def test_time_limit_marks_unfinished_checks_not_run(project: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["audit", "ref:tiny-decoder", "--suites", "padding", "--timeout", "0", "-q", "--json", "r.json"]) == 1
    report = json.loads((project / "r.json").read_text())
    assert report["suites"][0]["status"] == "not_run"
    assert "time limit (--timeout)" in report["suites"][0]["checks"][0]["message"]
    assert "NOT RUN" in capsys.readouterr().out


def test_json_report_is_written_after_every_suite(project: Path) -> None:
    """The progress hook leaves a valid, incomplete report on disk while the audit runs."""
    from maskcheck.harness.report.render import write_json

    seen = []

    def progress(event, suite, result):  # type: ignore[no-untyped-def]
        if event == "case":  # the live display's events; the report is saved at suite boundaries
            return
        write_json(project / "partial.json", result.to_dict())
        seen.append(json.loads((project / "partial.json").read_text()))

    audit("ref:tiny-decoder", ["causal", "padding"], progress=progress)
    # before the batching gate, then at the start and end of each suite
    assert [r["complete"] for r in seen] == [False, False, False, False, True]
    assert seen[0]["suites"] == [] and seen[0]["not_run"] == ["causal", "padding"]
    assert seen[2]["not_run"] == ["padding"] and [s["name"] for s in seen[2]["suites"]] == ["causal"]
    jsonschema.validate(seen[2], report_schema())


def test_help_of_every_subcommand_is_complete(capsys) -> None:  # type: ignore[no-untyped-def]
    parser = build_parser()
    for command in ("audit", "list", "replay", "effective-mask"):
        with pytest.raises(SystemExit):
            parser.parse_args([command, "--help"])
        text = capsys.readouterr().out
        assert text.startswith(f"usage: maskcheck {command}")
    with pytest.raises(SystemExit):
        parser.parse_args(["audit", "--help"])
    text = capsys.readouterr().out
    for flag in (
        "--suites",
        "--device",
        "--dtype",
        "--attn-implementation",
        "--task",
        "--examples",
        "--seed",
        "--profile",
        "--json",
        "--report",
        "--override",
        "--timeout",
        "--trust-remote-code",
        "-q",
        "-v",
        "Exit codes",
    ):
        assert flag in text


def test_list_shows_every_suite_and_seeded_bug(capsys) -> None:  # type: ignore[no-untyped-def]
    from maskcheck.harness.engine.registry import suite_names
    from maskcheck.reference_models.mutants import MUTANTS

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in suite_names()) and all(name in out for name in MUTANTS)


def test_module_factory_from_the_current_directory(project: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # A module name no other test uses: a process imports a module once, and test_adapters
    # writes its own my_models.py (under pytest-xdist both may run in one worker).
    (project / "cli_factories.py").write_text(
        "def hf():\n    from maskcheck.reference_models.hf_tiny import tiny_model\n    return tiny_model('llama')\n\n"
        "def adapter():\n    from maskcheck.harness.adapters.specs import load_adapter\n    return load_adapter('ref:tiny-decoder')\n"
    )
    assert main(["audit", "module:cli_factories:hf", "--suites", "causal", "-q"]) == 0
    assert main(["audit", "module:cli_factories:adapter", "--suites", "causal", "-q"]) == 0
    assert "module:cli_factories:adapter" in capsys.readouterr().out


# -- output that neither hides nor misleads ------------------------------------------------------


def synthetic_result(checks: list) -> object:  # type: ignore[type-arg]
    from maskcheck.harness.audits.runner import AuditResult
    from maskcheck.harness.engine.verdict import SuiteResult

    result = AuditResult("ref:synthetic", {})
    result.suites.append(SuiteResult("padding", checks, cases=3))
    return result


def test_the_table_explains_every_failing_check_and_its_worst_diff() -> None:
    from maskcheck.harness.engine.verdict import CheckResult
    from maskcheck.harness.report.render import render_table

    failing = [CheckResult(f"check_{i}", "fail", f"leak number {i}", 0.2, 0.0, 0.1) for i in range(11)]
    # A warn that measured far over its threshold: the column shows it, not the first fail's.
    warned = CheckResult(
        "positions", "warn", "left padding shifts positions; " + "advice " * 30 + "THE END", 5.0, 0.0, 0.01
    )
    text = render_table(synthetic_result([*failing, warned]), "synthetic", 0.1)
    assert all(f"padding/check_{i}: leak number {i}" in text for i in range(11))
    assert text.splitlines()[2].split()[3:6] == ["5", "/", "0.01"]
    assert "THE END" not in text and "THE END" in render_table(
        synthetic_result([warned]), "synthetic", 0.1, verbose=True
    )


def test_a_suite_line_says_how_many_of_its_checks_ran_and_why_the_others_did_not() -> None:
    from maskcheck.harness.engine.verdict import CheckResult
    from maskcheck.harness.report.render import render_markdown, render_table

    checks = [
        CheckResult("pad_ids", "pass", "", 0.0, 0.0, 0.1),
        CheckResult("extra_padding", "not_applicable", "the cache takes no mask"),
        CheckResult("padded_vs_unpadded", "not_applicable", "no unpadded call"),
    ]
    line = render_table(synthetic_result(checks), "synthetic", 0.1).splitlines()[2]
    assert line.split()[:3] == ["padding", "PASS", "1/3"], line
    assert "n/a: extra_padding (the cache takes no mask), padded_vs_unpadded (no unpadded call)" in line, line
    report = synthetic_result(checks).to_dict()  # type: ignore[attr-defined]
    assert report["suites"][0]["checks_run"] == 1
    assert "| padding | PASS 1/3 | 3 |" in render_markdown(report)
    nothing_ran = [CheckResult("pad_ids", "not_applicable", "no mask")]
    line = render_table(synthetic_result(nothing_ran), "synthetic", 0.1).splitlines()[2]
    assert line.split()[:2] == ["padding", "n/a"], line
    every_one = [CheckResult("pad_ids", "pass", "", 0.0, 0.0, 0.1)]
    line = render_table(synthetic_result(every_one), "synthetic", 0.1).splitlines()[2]
    assert line.split()[:3] == ["padding", "PASS", "3"], line


def test_report_md_keeps_the_output_input_pairs_of_a_pattern_leak(tmp_path: Path) -> None:
    assert main(["audit", "mutant:causal_sees_next_token", "--suites", "causal", "-q", "--report", str(tmp_path)]) == 1
    markdown = (tmp_path / "report.md").read_text()
    line = next(line for line in markdown.splitlines() if line.startswith("- positions [output, input]"))
    assert "[0, 1], [0, 2], [1, 2]" in line
    pairs = json.loads((tmp_path / "report.json").read_text())["suites"][0]["checks"]
    declared = next(c for c in pairs if c["name"] == "declared_pattern")
    assert declared["positions_label"] == "output, input" and len({tuple(p) for p in declared["positions"]}) == len(
        declared["positions"]
    )


def test_a_misspelt_suite_is_refused_before_the_model_loads(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["audit", "hf:./no-such-checkpoint", "--suites", "causl"]) == 2
    err = capsys.readouterr().err
    assert "causl (did you mean causal?)" in err and "no-such-checkpoint" not in err
