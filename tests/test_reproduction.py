"""Reproduction bundles, `maskcheck replay` and the Hypothesis profiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maskcheck import audit
from maskcheck.harness.cli import main
from maskcheck.harness.report.reproduction import (
    BundleError,
    load_bundle,
    replay,
    replay_check,
)
from maskcheck.reference_models import ModelConfig, Transformer, save_checkpoint
from maskcheck.reference_models.mutants import MUTANTS, build, build_clean

#: the seeded bugs whose bundles CI writes and replays: the first of each suite and the ones
#: caught on another call path than the canonical one; make test-slow writes and replays a
#: bundle of every bug of the catalogue
BUNDLED = sorted(
    {
        next(n for n, m in sorted(MUTANTS.items()) if m.suite == suite and not m.requires)
        for suite in {m.suite for m in MUTANTS.values()}
    }
    | {"module_mha_window_hint", "hf_llama_mask_dropped_default_cache", "scratch_backward_leak"}
    | {"kv_cache_chunk_sees_its_future", "padding_mask_ignored"}  # replayed by name below
)


def write_bundles(root: Path, names: list[str]) -> dict[str, Path]:
    written = {}
    for name in names:
        mutant = MUTANTS[name]
        result = audit(f"mutant:{name}", [mutant.suite], bundle_dir=root / name)
        written[name] = Path(result.suite(mutant.suite).reproduction)
        AUDIT_MESSAGES[name] = {c.name: c.message for c in result.suite(mutant.suite).checks if c.status == "fail"}
    return written


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One bundle per seeded bug of BUNDLED, each audited with its own suite only."""
    return write_bundles(tmp_path_factory.mktemp("bundles"), BUNDLED)


@pytest.mark.slow  # the whole catalogue: about two minutes
@pytest.mark.call_paths  # the path bugs fail only on their paths
def test_every_seeded_bug_writes_a_bundle_whose_replay_tells_the_audits_story(tmp_path: Path) -> None:
    written = write_bundles(tmp_path, sorted(name for name, mutant in MUTANTS.items() if not mutant.missing()))
    for name, path in written.items():
        assert (path / "case.json").is_file() and (path / "inputs.safetensors").stat().st_size > 0, name
        replayed = {r.check: (r.status, r.message) for r in replay(path)}
        assert replayed and all(status == "fail" for status, _ in replayed.values()), (name, replayed)
        assert {check: message for check, (_, message) in replayed.items()} == {
            check: AUDIT_MESSAGES[name].get(check) for check in replayed
        }, name


#: seeded bug -> failing check -> the audit's message, filled by the bundles fixture
AUDIT_MESSAGES: dict[str, dict[str, str]] = {}


def test_a_replay_tells_the_audits_story(bundles: dict[str, Path]) -> None:
    """The replayed message of every failing check equals the audit's, diagnosis included (a
    suite's conclude can revise one check's verdict from another's: a positional excuse
    withdrawn when padded ids leak; a path's name)."""
    for name, path in bundles.items():
        replayed = {r.check: r.message for r in replay(path)}
        assert replayed and replayed == {check: AUDIT_MESSAGES[name].get(check) for check in replayed}, name


def test_every_seeded_bug_writes_a_complete_bundle(bundles: dict[str, Path]) -> None:
    for name, path in bundles.items():
        mutant = MUTANTS[name]
        assert path.name == f"repro-{mutant.suite}"
        assert sorted(p.name for p in path.iterdir()) == sorted(
            ["case.json", "inputs.safetensors", f"test_repro_{mutant.suite}.py"]
        )
        data = load_bundle(path)
        assert data["model"]["spec"] == f"mutant:{name}"
        assert mutant.check in [c["check"] for c in data["checks"]]
        record = next(c for c in data["checks"] if c["check"] == mutant.check)
        assert record["inputs"], "the tensors the model received are recorded"
        assert record["outcome"]["max_diff"] > record["outcome"]["threshold"] or record["outcome"]["status"] == "fail"
        assert not [p for p in path.parent.iterdir() if p.name.startswith(".")], (
            "no half-written staging directory is left"
        )


def test_standalone_reproduction_files_fail_under_plain_pytest(bundles: dict[str, Path], tmp_path: Path) -> None:
    """All bundles' test files, copied to a fresh directory, run in one plain pytest process."""
    import shutil

    for name, path in bundles.items():
        shutil.copytree(path, tmp_path / name)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "--import-mode=importlib",
            "-rf",
            str(tmp_path),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    out = completed.stdout
    assert completed.returncode == 1, out[-3000:]
    expected = sum(len(load_bundle(p)["checks"]) for p in bundles.values())
    assert f"{expected} failed" in out and "passed" not in out.splitlines()[-1], out[-2000:]
    # Each file fails with the message maskcheck reported.
    for path in bundles.values():
        for record in load_bundle(path)["checks"]:
            assert record["outcome"]["message"].split(":")[0] in out


def test_bundles_pass_when_replayed_on_the_clean_model(bundles: dict[str, Path]) -> None:
    for name, path in bundles.items():
        results = replay(path, model=build_clean(name))
        assert results and all(r.status in ("pass", "warn") for r in results), [r.report() for r in results]


def test_replay_cli_reports_the_verdict(bundles: dict[str, Path], capsys) -> None:  # type: ignore[no-untyped-def]
    path = bundles["kv_cache_chunk_sees_its_future"]
    assert main(["replay", str(path)]) == 1
    out = capsys.readouterr().out
    assert (
        "kv_cache/incremental on mutant:kv_cache_chunk_sees_its_future: FAIL: cached decoding (prefill 1, then steps of 2)"
        in out
    )
    assert main(["replay", str(path), "--model", "ref:tiny-decoder"]) == 0
    assert "kv_cache/incremental on ref:tiny-decoder: PASS" in capsys.readouterr().out


def test_replay_says_when_the_weights_changed(tmp_path: Path) -> None:
    torch.manual_seed(0)
    checkpoint = save_checkpoint(Transformer(ModelConfig()), tmp_path / "model.safetensors")
    from maskcheck.harness.adapters.specs import LoadOptions

    result = audit(
        f"ref:{checkpoint}",
        ["norm_checkpoint"],
        options=LoadOptions(overrides={"norm_layout": "post"}),
        bundle_dir=tmp_path / "report",
    )
    bundle = Path(result.suite("norm_checkpoint").reproduction)
    data = load_bundle(bundle)
    assert data["model"]["spec"] == f"ref:{checkpoint}" and data["model"]["overrides"] == {"norm_layout": "post"}
    assert len(data["model"]["weights_sha256"]) == 64
    assert replay_check(bundle, "metadata").status == "fail"  # the override is replayed too
    torch.manual_seed(1)
    save_checkpoint(Transformer(ModelConfig()), checkpoint)
    replayed = replay_check(bundle, "metadata")
    assert replayed.weights_note and "changed since the bundle was written" in replayed.weights_note


def test_a_model_object_gets_a_bundle_that_replays_from_the_authors_factory(tmp_path: Path) -> None:
    result = audit(build("padding_mask_ignored"), ["padding"], bundle_dir=tmp_path)
    bundle = Path(result.suite("padding").reproduction)
    data = load_bundle(bundle)
    assert data["model"]["spec"] is None and "handed to maskcheck as an object" in data["model"]["note"]
    assert "set MODEL to it" in (bundle / "test_repro_padding.py").read_text()
    with pytest.raises(BundleError, match="set MODEL in its test file, or pass --model"):
        replay(bundle)
    assert replay_check(bundle, "pad_ids", model=build("padding_mask_ignored")).status == "fail"


def test_ci_profile_records_the_hypothesis_blob(tmp_path: Path) -> None:
    result = audit("mutant:causal_sees_next_token", ["causal"], profile="ci", bundle_dir=tmp_path)
    data = load_bundle(result.suite("causal").reproduction)
    blob = data["checks"][0]["hypothesis_blob"]
    assert blob and "@reproduce_failure(" in blob


def test_profiles_are_registered_with_hypothesis() -> None:
    import maskcheck.harness.engine.profiles  # noqa: F401

    assert settings.get_profile("maskcheck-quick").max_examples == 1
    assert settings.get_profile("maskcheck-dev").max_examples == 8
    ci = settings.get_profile("maskcheck-ci")
    assert ci.max_examples == 10 and ci.print_blob and ci.deadline is None and ci.database is None
    assert settings.get_profile("maskcheck-thorough").max_examples == 200
    assert set(HealthCheck) <= set(ci.suppress_health_check)


def test_examples_replace_the_profile_count_and_seed_keeps_runs_identical() -> None:
    first = audit("ref:tiny-decoder", ["padding"], profile="thorough", examples=3, seed=5).to_dict()
    again = audit("ref:tiny-decoder", ["padding"], profile="thorough", examples=3, seed=5).to_dict()
    for report in (first, again):
        for suite in report["suites"]:
            suite.pop("seconds")
        report.pop("run_id"), report.pop("started")
    assert first == again
    # At most 3 random cases and the minimal one per check (positions_from_mask draws fewer).
    assert first["suites"][0]["cases"] <= 5 * (3 + 1)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=8),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    )
)
def test_bundle_loader_rejects_malformed_json_with_a_bundle_error(tmp_path_factory, value) -> None:  # type: ignore[no-untyped-def]
    directory = tmp_path_factory.mktemp("fuzz")
    (directory / "case.json").write_text(json.dumps(value))
    try:
        load_bundle(directory)
    except BundleError:
        pass


def test_bundle_loader_errors_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="no reproduction bundle"):
        load_bundle(tmp_path / "missing")
    (tmp_path / "case.json").write_text("{not json")
    with pytest.raises(BundleError, match="not valid JSON"):
        load_bundle(tmp_path)
    (tmp_path / "case.json").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(BundleError):
        load_bundle(tmp_path)


# -- bundles replay from any directory -----------------------------------------------------------

pytest_plugins = ["pytester"]

FACTORY = """
import torch
from maskcheck.reference_models.mutants import build

SEED = {seed}


def buggy():
    model = build("padding_mask_ignored")
    with torch.no_grad():
        next(model.parameters()).add_(SEED)  # SEED 1: the same factory, other weights
    return model
"""


def run_bundle(bundle: Path, where: Path) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    """The bundle's test file under plain pytest, from ``where`` (not the audit's directory)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", str(bundle)],
        cwd=where,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def test_a_module_spec_bundle_replays_from_any_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "mypkg").mkdir(parents=True)
    elsewhere.mkdir()
    (project / "mypkg" / "__init__.py").write_text("")
    (project / "mypkg" / "models.py").write_text(FACTORY.format(seed=0))
    monkeypatch.chdir(project)
    result = audit("module:mypkg.models:buggy", ["padding"], bundle_dir=project / "report")
    bundle = Path(result.suite("padding").reproduction)
    assert load_bundle(bundle)["model"]["import_root"] == str(project)
    import shutil

    copied = shutil.copytree(bundle, elsewhere / "repro-padding")
    completed = run_bundle(copied, elsewhere)
    assert "failed" in completed.stdout and " error" not in completed.stdout, completed.stdout[-2000:]
    assert "changing the ids at left-padded slots changed real logits" in completed.stdout
    # Other weights behind the same factory: the replay still runs, and says so.
    (project / "mypkg" / "models.py").write_text(FACTORY.format(seed=1))
    sys.modules.pop("mypkg.models", None)
    monkeypatch.chdir(elsewhere)
    replayed = replay(copied)[0]
    assert replayed.weights_note and "changed since the bundle was written" in replayed.weights_note


HOOK_CONFTEST = """
from maskcheck import ModelEntry


def buggy():
    from maskcheck.reference_models.mutants import build
    return build("padding_mask_ignored")


def pytest_maskcheck_models(config):
    return [ModelEntry("by-name", buggy), ModelEntry("by-lambda", lambda: buggy())]
"""


@pytest.mark.slow  # a minute of plugin runs; the module-spec replay stays in CI
def test_hook_models_replay_by_name_and_a_closure_says_what_to_do(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CI", raising=False)  # under CI, pytest's summary line repeats the whole message
    pytester.makeconftest(HOOK_CONFTEST)
    result = pytester.runpytest_subprocess("-p", "no:xdist", "-p", "no:cacheprovider", "--maskcheck-suites", "padding")
    out = result.stdout.str()
    assert result.parseoutcomes() == {"failed": 2}, out[-2000:]
    assert out.count("the bundle cannot rebuild this model by itself") == 1  # said at failure time, for the lambda only
    import shutil

    named = shutil.copytree(pytester.path / "maskcheck-report" / "by-name" / "repro-padding", tmp_path / "named")
    assert load_bundle(named)["model"]["spec"] == "module:conftest:buggy"
    replayed = run_bundle(named, tmp_path)
    assert "failed" in replayed.stdout and "left-padded slots" in replayed.stdout, replayed.stdout[-2000:]
    # The lambda's bundle cannot rebuild its model: an ERROR of the setup with the reason, never a FAIL.
    closure = shutil.copytree(pytester.path / "maskcheck-report" / "by-lambda" / "repro-padding", tmp_path / "closure")
    replayed = run_bundle(closure, tmp_path)
    assert " error" in replayed.stdout and "failed" not in replayed.stdout, replayed.stdout[-2000:]
    assert "cannot rebuild the model to replay on" in replayed.stdout and "set MODEL" in replayed.stdout


def test_format_1_bundles_still_replay(bundles: dict[str, Path], tmp_path: Path) -> None:
    import shutil

    old = shutil.copytree(bundles["padding_mask_ignored"], tmp_path / "old")
    data = json.loads((old / "case.json").read_text())
    data["format"] = 1
    for record in data["checks"]:
        record["case"]["type"] = record["case"]["type"].removeprefix("maskcheck.")  # 0.1 wrote suites.padding:...
    (old / "case.json").write_text(json.dumps(data))
    assert {r.status for r in replay(old)} == {"fail"}


def test_a_rearranging_checks_bundle_keeps_the_inputs_of_the_decode_it_rearranges(tmp_path: Path) -> None:
    """The prefix decode the three rearranging checks share goes through the recorder's own
    prefill and step: the bundle keeps the prompt and the tokens fed before the reorder."""
    written = write_bundles(tmp_path, ["module_cache_reorder_keys_only"])
    bundle = load_bundle(written["module_cache_reorder_keys_only"])
    record = next(c for c in bundle["checks"] if c["check"] == "beam_reorder")
    calls = [call.split("_", 1)[1] for call in sorted({name.split(".")[0] for name in record["inputs"]})]
    rearranged = len(calls) - 1 - calls[::-1].index("rearrange_reorder")  # the case's (the suite's probes come first)
    assert calls[rearranged - 2 : rearranged + 1] == ["prefill", "step", "rearrange_reorder"], calls
