"""The pytest plugin, exercised in a small fake repo with pytester (serial and with -n 2)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

MODELS = """
def good():
    import torch
    from maskcheck.reference_models import PRESETS, Transformer
    torch.manual_seed(0)
    return Transformer(PRESETS["tiny-decoder"])


def buggy():
    from maskcheck.reference_models.mutants import build
    return build("padding_mask_ignored")
"""

PYPROJECT = '''
[tool.pytest.ini_options]
addopts = "-p no:cacheprovider --strict-markers"
maskcheck_models = """
module:models:good
module:models:buggy
"""
maskcheck_suites = "causal,padding"
maskcheck_profile = "dev"
'''


@pytest.fixture
def fake_repo(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(models=MODELS, test_own="def test_own():\n    assert True\n")
    pytester.makefile(".toml", pyproject=PYPROJECT)
    return pytester


def outcomes(result: pytest.RunResult) -> dict[str, int]:
    return result.parseoutcomes()


@pytest.mark.parametrize("workers", [None, "2"])
def test_one_test_per_suite_per_model_and_the_buggy_one_fails(fake_repo: pytest.Pytester, workers: str | None) -> None:
    args = ["-n", workers] if workers else ["-p", "no:xdist"]
    result = fake_repo.runpytest_subprocess(*args, "--junitxml=junit.xml", "-rA")
    assert outcomes(result) == {"passed": 4, "failed": 1}, result.stdout.str()[-3000:]
    out = result.stdout.str()
    assert "FAILED maskcheck::test_maskcheck[padding-module:models:buggy]" in out
    assert "pad_ids: FAIL: changing the ids at left-padded slots changed real logits" in out
    assert "reproduction: pytest " in out and "repro-padding" in out
    # Reports from every worker are merged per model; bundles sit beside them.
    report = json.loads((fake_repo.path / "maskcheck-report" / "module_models_buggy" / "report.json").read_text())
    assert [s["name"] for s in report["suites"]] == ["causal", "padding"]
    assert (
        fake_repo.path / "maskcheck-report" / "module_models_buggy" / "repro-padding" / "test_repro_padding.py"
    ).is_file()
    # Figures go into the JUnit XML as properties.
    properties = {
        p.get("name"): p.get("value") for p in ElementTree.parse(fake_repo.path / "junit.xml").iter("property")
    }
    assert "pad_ids.max_diff" in properties and "pad_ids.threshold" in properties


def test_k_selects_generated_tests_and_bundles_are_not_collected(fake_repo: pytest.Pytester) -> None:
    assert outcomes(fake_repo.runpytest_subprocess("-p", "no:xdist")) == {"passed": 4, "failed": 1}
    # The bundle written by that run holds a failing test; the next run must not collect it.
    result = fake_repo.runpytest_subprocess("-p", "no:xdist", "-k", "causal and good")
    assert outcomes(result) == {"passed": 1, "deselected": 4}, result.stdout.str()[-2000:]


def test_command_line_models_and_suites_and_skip_with_reason(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess(
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "--maskcheck-model",
        "ref:tiny-encoder",
        "--maskcheck-suites",
        "kv_cache,causal",
        "-rs",
    )
    assert outcomes(result) == {"passed": 2, "skipped": 1}, result.stdout.str()[-2000:]
    assert "the model declares no KV cache" in result.stdout.str()


def test_a_passing_suite_s_checks_that_did_not_run_are_pytest_warnings(pytester: pytest.Pytester) -> None:
    """serving passes 5 of its 9 checks on the reference decoder: the test is green, and each
    check that did not run is a warning with its reason, not silence."""
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:xdist", "-p", "no:cacheprovider",
        "--maskcheck-model", "ref:tiny-decoder", "--maskcheck-suites", "serving",
    )  # fmt: skip
    assert outcomes(result)["passed"] == 2
    out = result.stdout.str()
    assert (
        "maskcheck serving/reuse on ref:tiny-decoder: not run (n/a): the reference model's KVCache is immutable" in out
    )


def test_warn_becomes_a_pytest_warning(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess(
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "--maskcheck-model",
        "ref:tiny-decoder",
        "--maskcheck-suites",
        "norm_checkpoint",
    )
    assert outcomes(result)["passed"] == 2
    out = result.stdout.str()
    assert "MaskcheckWarning" in out and "inconclusive" in out
    # The warning names the model and the suite, and points at no line of maskcheck's own code.
    assert "maskcheck norm_checkpoint/behaviour on ref:tiny-decoder:" in out
    assert "testing.py" not in out and "hooks.py" not in out


def test_the_warning_points_at_the_configuration_that_names_the_model(fake_repo: pytest.Pytester) -> None:
    result = fake_repo.runpytest_subprocess("-p", "no:xdist", "-k", "good", "--maskcheck-suites", "norm_checkpoint")
    out = result.stdout.str()
    line = next((line for line in out.splitlines() if "pyproject.toml:" in line), "")
    number = int(line.split("pyproject.toml:")[1].split(":")[0]) if line else 0
    toml = (fake_repo.path / "pyproject.toml").read_text().splitlines()
    assert number and "module:models:good" in toml[number - 1], out[-2500:]


def test_a_passing_run_says_what_it_audited_and_where_the_reports_are(fake_repo: pytest.Pytester) -> None:
    result = fake_repo.runpytest_subprocess("-p", "no:xdist", "-k", "good")
    assert "maskcheck: audited 1 model x 2 suites (" in result.stdout.str()
    assert "reports in maskcheck-report/" in result.stdout.str()


def test_reports_carry_their_run_and_a_report_the_run_did_not_write_says_so(fake_repo: pytest.Pytester) -> None:
    """An interrupted or narrowed run left the other model's earlier report looking current."""
    report_dir = fake_repo.path / "maskcheck-report"
    fake_repo.runpytest_subprocess("-p", "no:xdist")
    first = json.loads((report_dir / "module_models_good" / "report.json").read_text())
    assert first["run_id"] and first["started"] and first["complete"] is True and "stale" not in first
    fake_repo.runpytest_subprocess("-p", "no:xdist", "-k", "buggy")  # this run leaves `good` out
    stale = json.loads((report_dir / "module_models_good" / "report.json").read_text())
    assert stale["complete"] is False and "did not audit module:models:good" in stale["stale"]
    assert first["run_id"] in stale["stale"]
    assert "**Stale:**" in (report_dir / "module_models_good" / "report.md").read_text()
    current = json.loads((report_dir / "module_models_buggy" / "report.json").read_text())
    assert current["run_id"] != first["run_id"] and "stale" not in current
    # The report directory keeps itself out of git, as pytest's cache does.
    assert (report_dir / ".gitignore").read_text().splitlines()[-1] == "*"


def test_hook_fixture_and_helper_for_test_authors(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
from maskcheck.harness.plugin.testing import ModelEntry


def build():
    from maskcheck.reference_models.mutants import build_clean
    return build_clean("kv_cache_appended_twice")


def pytest_maskcheck_models(config):
    return [ModelEntry("my-decoder", build)]
"""
    )
    pytester.makepyfile(
        test_mine="""
from maskcheck.harness.plugin.testing import maskcheck_tests
from maskcheck.reference_models.mutants import build

test_buggy_cache = maskcheck_tests(lambda: build("kv_cache_appended_twice"), suites=["kv_cache"], name="buggy", profile="dev")


def test_adapter_fixture(maskcheck_adapter):
    assert maskcheck_adapter.capabilities.has_cache
"""
    )
    result = pytester.runpytest_subprocess(
        "-p", "no:xdist", "-p", "no:cacheprovider", "--maskcheck-suites", "kv_cache", "-v"
    )
    out = result.stdout.str()
    assert outcomes(result) == {"passed": 2, "failed": 1}, out[-3000:]
    assert "test_adapter_fixture[my-decoder] PASSED" in out
    assert "test_maskcheck[kv_cache-my-decoder] PASSED" in out
    assert "test_buggy_cache[kv_cache] FAILED" in out and "cached decoding" in out


def test_unknown_suite_is_a_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:xdist", "--maskcheck-model", "ref:tiny-decoder", "--maskcheck-suites", "nope"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "unknown suite(s) nope" in result.stderr.str()


def test_a_model_that_cannot_load_fails_its_tests_with_one_line(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:xdist", "-p", "no:cacheprovider", "--maskcheck-model", "hf:./missing", "--maskcheck-suites", "causal"
    )
    assert outcomes(result) == {"passed": 1, "failed": 1}
    assert "cannot load hf:./missing: no such directory" in result.stdout.str()


# -- a run never goes green without saying what it did not audit --------------------------------


def test_test_paths_leave_configured_models_out_and_the_summary_says_so(fake_repo: pytest.Pytester) -> None:
    result = fake_repo.runpytest_subprocess("-p", "no:xdist", "test_own.py")
    assert outcomes(result) == {"passed": 1}
    line = next(line for line in result.stdout.lines if "NOT audited" in line)
    assert "maskcheck: 2 configured models NOT audited: module:models:good, module:models:buggy" in line
    assert "test paths were given: run pytest without paths, or add --maskcheck-always" in line
    # --maskcheck-require turns the line into a failing run; --maskcheck-always audits them.
    required = fake_repo.runpytest_subprocess("-p", "no:xdist", "test_own.py", "--maskcheck-require")
    assert required.ret == pytest.ExitCode.TESTS_FAILED and "(require: the run fails)" in required.stdout.str()
    always = fake_repo.runpytest_subprocess("-p", "no:xdist", "test_own.py", "--maskcheck-always")
    assert outcomes(always) == {"passed": 4, "failed": 1} and "NOT audited" not in always.stdout.str()


REQUIRING_PYPROJECT = """
[tool.pytest.ini_options]
addopts = "-p no:cacheprovider -p no:xdist"

[tool.maskcheck]
models = ["ref:tiny-decoder"]
suites = ["causal"]
profile = "dev"
require = true
"""


@pytest.fixture
def requiring_repo(pytester: pytest.Pytester) -> pytest.Pytester:
    """A host that configures maskcheck only in [tool.maskcheck], require included, as the README shows."""
    pytester.makepyfile(test_own="def test_one():\n    assert True\n\ndef test_two():\n    assert True\n")
    pytester.makefile(".toml", pyproject=REQUIRING_PYPROJECT)
    return pytester


def test_require_leaves_targeted_runs_and_collect_only_green(requiring_repo: pytest.Pytester) -> None:
    """An IDE's run of one test, a run by path and --collect-only were red under require."""
    for args in (["test_own.py::test_one"], ["test_own.py"], ["--collect-only"], ["--collect-only", "-q"]):
        result = requiring_repo.runpytest_subprocess(*args)
        assert result.ret == pytest.ExitCode.OK, (args, result.stdout.str()[-1500:])
    run = requiring_repo.runpytest_subprocess()  # the run meant to audit: every configured model runs
    assert outcomes(run) == {"passed": 3}


def test_require_fails_a_run_meant_to_audit_with_a_junit_case(requiring_repo: pytest.Pytester) -> None:
    """-k leaves the model out of a run given no paths: under a configured require that run is
    meant to audit only when nothing narrows it, so -k is green; --maskcheck-require on the
    command line (what CI passes) fails it, with a failing maskcheck::require case in JUnit."""
    narrowed = requiring_repo.runpytest_subprocess("-k", "test_one")
    assert narrowed.ret == pytest.ExitCode.OK and "NOT audited" in narrowed.stdout.str()
    result = requiring_repo.runpytest_subprocess("-k", "test_one", "--maskcheck-require", "--junitxml=junit.xml")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "FAILED maskcheck::require" in out and "(require: the run fails)" in out
    assert "1 failed, 1 passed" in out
    cases = ElementTree.parse(requiring_repo.path / "junit.xml").getroot().iter("testcase")
    failing = [c for c in cases if c.find("failure") is not None]
    assert [c.get("name") for c in failing] == ["require"], [c.attrib for c in failing]
    assert "NOT audited" in failing[0].find("failure").get("message", "") + (failing[0].find("failure").text or "")


def test_a_host_without_maskcheck_stays_warning_free_under_strict_config(requiring_repo: pytest.Pytester) -> None:
    """[tool.maskcheck] is not pytest's to validate: -p no:maskcheck (a contributor without
    maskcheck) and --strict-config give no PytestConfigWarning and exit 0."""
    result = requiring_repo.runpytest_subprocess("-p", "no:maskcheck", "--strict-config", "-W", "error")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()[-1500:] + result.stderr.str()[-1500:]
    assert "PytestConfigWarning" not in result.stdout.str() + result.stderr.str()


def test_a_setting_in_both_tables_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_one():\n    assert True\n")
    pytester.makefile(
        ".toml",
        pyproject='[tool.pytest.ini_options]\nmaskcheck_profile = "dev"\n\n[tool.maskcheck]\n'
        'models = ["ref:tiny-decoder"]\nprofile = "ci"\n',
    )
    result = pytester.runpytest_subprocess("-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "maskcheck_profile in [tool.pytest.ini_options] and profile in [tool.maskcheck]" in result.stderr.str()


def test_a_key_of_a_newer_maskcheck_is_a_warning_not_an_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_one():\n    assert True\n")
    pytester.makefile(".toml", pyproject='[tool.maskcheck]\nmodels = ["ref:tiny-decoder"]\nsuites = ["causal"]\n'
                      'profile = "dev"\nfuture_knob = 3\n')  # fmt: skip
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    assert outcomes(result)["passed"] == 2, result.stdout.str()[-1500:]
    assert "'future_knob' is not known to this maskcheck and is ignored" in result.stdout.str()


INTERRUPTING_CONFTEST = """
import os

import maskcheck.harness.plugin.run_report as run_report


def pytest_sessionstart(session):
    if os.environ.get("INTERRUPT_AT") == "merge":  # Ctrl-C pressed again while the reports merge
        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt
        run_report.merge_run = interrupted


def pytest_runtest_call(item):
    if os.environ.get("INTERRUPT_AT") == "audit" and "maskcheck" in item.keywords:
        raise KeyboardInterrupt  # Ctrl-C during an audit
"""


@pytest.mark.parametrize("moment", ["audit", "merge"])
def test_an_interrupt_is_always_pytests_interrupted(
    requiring_repo: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, moment: str
) -> None:
    """Ctrl-C under pytest exits with pytest's INTERRUPTED (2) whenever it comes, never 130 (the CLI's)."""
    requiring_repo.makeconftest(INTERRUPTING_CONFTEST)
    monkeypatch.setenv("INTERRUPT_AT", moment)
    result = requiring_repo.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.INTERRUPTED, (result.ret, result.stdout.str()[-1500:])


def test_deselected_models_are_named_and_counts_stay_positive(fake_repo: pytest.Pytester) -> None:
    result = fake_repo.runpytest_subprocess("-p", "no:xdist", "-k", "causal and good")
    out = result.stdout.str()
    assert "collected 5 items / 4 deselected / 1 selected" in out, out[-2000:]
    assert "module:models:good (padding), module:models:buggy [deselected by -k/-m]" in out


def test_the_merged_report_describes_this_run_only(fake_repo: pytest.Pytester) -> None:
    model_dir = fake_repo.path / "maskcheck-report" / "module_models_buggy"
    assert outcomes(fake_repo.runpytest_subprocess("-p", "no:xdist")) == {"passed": 4, "failed": 1}
    assert (model_dir / "repro-padding" / "case.json").is_file() and (
        model_dir / "padding-effective-mask.png"
    ).is_file()
    # Files that are not maskcheck's own, in and beside the model's directory, are never touched.
    (model_dir / "notes.txt").write_text("mine")
    (model_dir / "repro-notes").mkdir()
    (fake_repo.path / "maskcheck-report" / "keep.png").write_bytes(b"mine")
    # A later run of causal alone: padding's result, bundle and picture are not this run's.
    assert outcomes(fake_repo.runpytest_subprocess("-p", "no:xdist", "-k", "causal")) == {"passed": 2, "deselected": 3}
    report = json.loads((model_dir / "report.json").read_text())
    assert [s["name"] for s in report["suites"]] == ["causal"] and report["complete"] is True
    assert "FAIL" not in (model_dir / "report.md").read_text()
    assert not (model_dir / "repro-padding").exists() and not (model_dir / "padding-effective-mask.png").exists()
    assert (model_dir / "notes.txt").read_text() == "mine" and (model_dir / "repro-notes").is_dir()
    assert (fake_repo.path / "maskcheck-report" / "keep.png").read_bytes() == b"mine"
    assert not (model_dir / "results").exists()


def test_running_a_bundle_or_ones_own_tests_never_deletes_a_bundle(fake_repo: pytest.Pytester) -> None:
    model_dir = fake_repo.path / "maskcheck-report" / "module_models_buggy"
    assert outcomes(fake_repo.runpytest_subprocess("-p", "no:xdist")) == {"passed": 4, "failed": 1}
    bundle = model_dir / "repro-padding"
    for _ in range(2):  # debugging a leak: the bundle's test, run again and again
        assert outcomes(fake_repo.runpytest_subprocess("-p", "no:xdist", str(bundle))).get("failed")
        assert (bundle / "case.json").is_file() and (model_dir / "report.json").is_file()
    fake_repo.runpytest_subprocess("-p", "no:xdist", "test_own.py")
    assert (bundle / "case.json").is_file() and (model_dir / "report.md").is_file()


INTERRUPTING_MODELS = """
def good():
    import torch
    from maskcheck.reference_models import PRESETS, Transformer
    torch.manual_seed(0)
    return Transformer(PRESETS["tiny-decoder"])


def interrupted():
    raise KeyboardInterrupt  # Ctrl-C while the second model loads
"""


@pytest.mark.parametrize("stop", ["ctrl-c", "-x"])
def test_an_interrupted_run_is_never_complete(pytester: pytest.Pytester, stop: str) -> None:
    """Ctrl-C while the second model loads, or -x after the first failure: the first model's
    report says incomplete, and the summary names what did not finish."""
    if stop == "ctrl-c":
        pytester.makepyfile(models=INTERRUPTING_MODELS)
        first, second, extra = "good", "interrupted", []
    else:
        pytester.makepyfile(models=MODELS)
        first, second, extra = "buggy", "good", ["-x"]
    result = pytester.runpytest_subprocess(
        "-p",
        "no:xdist",
        "-p",
        "no:cacheprovider",
        "--maskcheck-suites",
        "padding,causal",
        "--maskcheck-model",
        f"module:models:{first}",
        "--maskcheck-model",
        f"module:models:{second}",
        *extra,
    )
    report = json.loads((pytester.path / "maskcheck-report" / f"module_models_{first}" / "report.json").read_text())
    assert report["complete"] is False, result.stdout.str()[-2000:]
    if stop == "-x":
        assert [s["name"] for s in report["suites"]] == ["padding"] and report["not_run"] == ["causal"]
    line = next(line for line in result.stdout.lines if "NOT audited" in line)
    assert f"module:models:{second} [interrupted or stopped before they finished]" in line


def test_invalid_settings_are_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    pytester.makefile(
        ".toml",
        pyproject='[tool.pytest.ini_options]\nmaskcheck_models = "ref:tiny-decoder"\nmaskcheck_profile = "fast"\n',
    )
    result = pytester.runpytest_subprocess("-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = result.stderr.str()
    assert "maskcheck_profile = 'fast' is not one of quick, dev, ci, thorough" in errors and "Traceback" not in errors
    assert errors.count("maskcheck_profile") == 1


def test_a_misspelt_suite_gets_a_suggestion(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:xdist", "--maskcheck-model", "ref:tiny-decoder", "--maskcheck-suites", "causl"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR and "causl (did you mean causal?)" in result.stderr.str()


def test_a_helper_failure_prints_once(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)  # under CI, pytest's summary line repeats the whole message
    pytester.makepyfile(
        test_mine="""
from maskcheck import maskcheck_tests
from maskcheck.reference_models.mutants import build

test_buggy = maskcheck_tests(lambda: build("causal_sees_next_token"), suites=["causal"], name="buggy", profile="dev")
"""
    )
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert outcomes(result) == {"failed": 1}
    assert "During handling of the above exception" not in out and out.count("maskcheck causal on buggy: FAIL") == 1


THREADS_MODELS = """
import os
from pathlib import Path


def counted():
    import torch
    from maskcheck.reference_models import PRESETS, Transformer

    torch.manual_seed(0)
    model = Transformer(PRESETS["tiny-decoder"])
    name = "during-%s.txt" % os.environ.get("PYTEST_XDIST_WORKER", "main")

    def record(*_):  # returns None: a pre-hook's value would replace the forward's arguments
        Path(name).write_text(str(torch.get_num_threads()))

    model.register_forward_pre_hook(record)
    return model
"""
THREADS_CONFTEST = """
import os
from pathlib import Path


def pytest_runtest_teardown(item):
    if "maskcheck" in item.keywords:  # a worker that ran an audit: what it left torch with
        import torch
        Path("after-%s.txt" % os.environ.get("PYTEST_XDIST_WORKER", "main")).write_text(str(torch.get_num_threads()))
"""


@pytest.mark.parametrize(
    "setting, expected",
    [("auto", "share"), pytest.param("keep", "default", marks=pytest.mark.slow), ("1", "1")],
)
def test_each_worker_audits_with_a_fair_share_of_threads_and_gives_them_back(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, setting: str, expected: str
) -> None:
    import subprocess
    import sys

    from maskcheck.harness.plugin.threads import fair_share, usable_cores

    cores = usable_cores()
    if cores < 2:
        pytest.skip("needs two cores to tell a fair share from torch's default")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    pytester.makeconftest(THREADS_CONFTEST)
    pytester.makepyfile(models=THREADS_MODELS, test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess(
        "-n",
        "2",
        "-p",
        "no:cacheprovider",
        "--maskcheck-model",
        "module:models:counted",
        "--maskcheck-suites",
        "causal,padding",
        "--maskcheck-threads",
        setting,
    )
    assert outcomes(result) == {"passed": 3}, result.stdout.str()[-2000:]
    default = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.get_num_threads())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    want = {"share": str(fair_share(cores, 2)), "default": default, "1": "1"}[expected]
    during = {path.read_text() for path in pytester.path.glob("during-gw*.txt")}
    after = {path.read_text() for path in pytester.path.glob("after-gw*.txt")}
    assert during == {want} and after == {default}, (during, after, want, default)


HOST_STATE_CONFTEST = """
import random
from pathlib import Path

import numpy
import torch


def state():
    return (torch.initial_seed(), torch.get_rng_state().tolist(), random.getstate(),
            numpy.random.get_state()[1].tolist(), torch.get_num_threads())


def pytest_runtest_setup(item):
    if "maskcheck" in item.keywords:
        item.stash_state = state()


def pytest_runtest_teardown(item):
    if "maskcheck" in item.keywords:
        Path("host-%s.txt" % item.name).write_text("same" if state() == item.stash_state else "changed")
"""


def test_a_maskcheck_test_leaves_the_host_random_state_and_threads_as_it_found_them(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An audit seeds torch (the reference models, the tiny configs) and may lower its
    threads; the host's own unseeded tests that run next in the same worker must not see it."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    pytester.makeconftest(HOST_STATE_CONFTEST)
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    result = pytester.runpytest_subprocess(
        "-p", "no:xdist", "-p", "no:cacheprovider", "--maskcheck-model", "ref:tiny-decoder",
        "--maskcheck-suites", "causal", "--maskcheck-threads", "1",
    )  # fmt: skip
    assert outcomes(result) == {"passed": 2}, result.stdout.str()[-2000:]
    assert [path.read_text() for path in pytester.path.glob("host-*.txt")] == ["same"]


COLLATOR_PYPROJECT = """
[tool.pytest.ini_options]
addopts = "-p no:cacheprovider --strict-markers"

[tool.maskcheck]
collators = [
    "maskcheck.reference_models.collator_mutants:masks_every_eos",
    {factory = "maskcheck.reference_models.collator_mutants:positions_not_restarted", task = "packed"},
]
"""

GRADIENT_TEST = """
import maskcheck
from maskcheck.reference_models.hf_tiny import tiny_model


def per_batch_mean(model, micro_batches):
    for batch in micro_batches:
        (model(**batch).loss / len(micro_batches)).backward()


def test_my_training_loop_normalises_by_all_targets():
    maskcheck.assert_gradient_accumulation(tiny_model("llama"), per_batch_mean)
"""


def test_configured_collators_are_tests_and_the_gradient_helper_fails_a_wrong_normaliser(
    pytester: pytest.Pytester,
) -> None:
    pytester.makefile(".toml", pyproject=COLLATOR_PYPROJECT)
    pytester.makepyfile(test_training=GRADIENT_TEST)
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-rA")
    assert outcomes(result) == {"failed": 3}
    output = result.stdout.str()
    assert (
        "FAILED maskcheck::test_maskcheck_collator[causal-lm-maskcheck.reference_models.collator_mutants:masks_every_eos]"
        in output
    )
    assert "target_labels: FAIL: labels are -100 at 1 real EOS token(s)" in output
    assert "positions_restart: FAIL: position ids do not restart" in output
    assert "AssertionError: accumulated gradients differ from the whole batch's" in output


def test_the_call_paths_are_chosen_on_the_command_line_and_an_unknown_one_is_a_usage_error(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    common = ["-p", "no:xdist", "-p", "no:cacheprovider", "--maskcheck-model", "ref:tiny-decoder"]
    bad = pytester.runpytest_subprocess(*common, "--maskcheck-paths", "training,sideways")
    assert bad.ret == pytest.ExitCode.USAGE_ERROR
    assert "maskcheck: unknown call path(s) sideways; choose from" in bad.stderr.str()
    ran = pytester.runpytest_subprocess(*common, "--maskcheck-suites", "causal", "--maskcheck-paths", "training")
    assert outcomes(ran) == {"passed": 2}, ran.stdout.str()[-2000:]
    report = json.loads(next((pytester.path / "maskcheck-report").glob("*/report.json")).read_text())
    assert [p["path"] for p in report["environment"]["paths"]] == ["canonical", "training_backward", "training"]


COMPARE_PYPROJECT = """
[tool.pytest.ini_options]
addopts = "-p no:cacheprovider"

[tool.maskcheck]
profile = "dev"

[[tool.maskcheck.compare]]
a = "module:maskcheck.reference_models.plain:plain_decoder"
b = "module:maskcheck.reference_models.plain_port:ported_plain_decoder"
weights = "keys.json"
suites = ["causal", "kv_cache"]

[[tool.maskcheck.compare]]
a = "module:maskcheck.reference_models.ports:llama"
b = "module:maskcheck.reference_models.ports:rotary_wrong_half_llama"
suites = "causal"
"""


def test_configured_pairs_are_compared_one_test_each_and_a_port_that_parts_fails_with_its_module(
    pytester: pytest.Pytester,
) -> None:
    from maskcheck.reference_models.plain import PlainDecoder
    from maskcheck.reference_models.plain_port import port_key

    pytester.makefile(".toml", pyproject=COMPARE_PYPROJECT)
    keys = {name: port_key(name) for name in PlainDecoder().state_dict()}
    pytester.makefile(".json", keys=json.dumps(keys))
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-rA")
    assert outcomes(result) == {"passed": 1, "failed": 1}, result.stdout.str()[-3000:]
    output = result.stdout.str()
    clean = "maskcheck.reference_models.plain:plain_decoder-vs-module:maskcheck.reference_models.plain_port"
    assert f"PASSED maskcheck::test_maskcheck[compare-module:{clean}" in output
    assert "FAILED maskcheck::test_maskcheck[compare-module:maskcheck.reference_models.ports:llama-vs-" in output
    assert "first differing module: model.layers.0.self_attn.o_proj" in output
    bundles = list((pytester.path / "maskcheck-report").glob("compare-*/repro-compare-causal-future_tokens"))
    assert len(bundles) == 1 and (bundles[0] / "test_repro_compare.py").is_file()
    # left out by a run given test paths: said, as a configured model is
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    targeted = pytester.runpytest_subprocess("-p", "no:xdist", "test_own.py")
    assert "2 configured models NOT audited" in targeted.stdout.str()


def test_a_bad_compare_entry_is_one_usage_error(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", pyproject='[[tool.maskcheck.compare]]\na = "ref:tiny-decoder"\n')
    result = pytester.runpytest_subprocess("-p", "no:xdist")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = result.stderr.str()
    assert 'each compare entry is a table with a = "SPEC" and b = "SPEC"' in errors and "Traceback" not in errors


def test_the_settings_table_is_written_once() -> None:
    """docs/plugin.md shows the table the options are built from, row for row, and every
    option is named literally in the code (a search for it finds its record)."""
    from maskcheck.harness.plugin import settings

    page = (Path(__file__).resolve().parent.parent / "docs" / "plugin.md").read_text()
    assert settings.markdown_table() in page, "docs/plugin.md's settings table differs from settings.SETTINGS"
    source = Path(settings.__file__).read_text()
    assert all(f'"{each.option}"' in source for each in settings.SETTINGS)
