"""Call paths: every check also runs on the calls users make (no mask, the default cache,
the training forward) and the backward of the training forward is audited.

Each seeded bug here is exact on the canonical path, the only one every check ran on
before call paths existed: ``paths=("canonical",)`` is that audit, and these tests show
it passes each bug, and that the path named fails it. Audited by that commit itself
(a5251a5, ``dev`` and ``ci``), each was missed: ``causal`` passed the MHA decoder with the
``is_causal`` hint, the encoder-layer decoder and the backward leak; ``padding`` passed
the Llama that drops its mask (only ``kv_cache`` failed it, blaming the cache).
"""

from __future__ import annotations

import pytest
import torch

from maskcheck import audit
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.paths import BARE_CALL, MASK_OF_ONES, PATHS, TRAINING, training_forward
from maskcheck.harness.adapters.specs import adapter_for
from maskcheck.reference_models.hf_tiny import tiny_model
from maskcheck.reference_models.mutants import MUTANTS, build, build_clean
from maskcheck.reference_models.path_bugs import WindowedMHADecoder

pytestmark = pytest.mark.call_paths  # every call path (conftest.py)

PATH_BUGS = {
    # mutant: (suite, check, the path whose run fails it)
    "module_mha_window_hint": ("causal", "declared_pattern", "training"),
    "module_encoder_window_dropped_with_grad": ("causal", "declared_pattern", "training"),
    "hf_llama_mask_dropped_default_cache": ("padding", "pad_ids", "default_cache"),
}


def check_of(result, suite: str, name: str):  # type: ignore[no-untyped-def]
    return next(c for c in result.suite(suite).checks if c.name == name)


@pytest.mark.parametrize("name", sorted(PATH_BUGS))
def test_a_bug_on_one_call_path_is_caught_there_and_missed_on_the_canonical_path(name: str) -> None:
    suite, check_name, path = PATH_BUGS[name]
    assert (MUTANTS[name].suite, MUTANTS[name].check) == (suite, check_name)
    canonical = check_of(audit(build(name), [suite], paths=("canonical",)), suite, check_name)
    assert canonical.status in ("pass", "warn"), f"{name} is not a path bug: {canonical.message}"
    check = check_of(audit(build(name), [suite]), suite, check_name)
    assert check.status == "fail", check.message
    assert check.message.startswith(f"on the {path} path ("), check.message
    runs = {run["path"]: run for run in check.paths}
    assert runs["canonical"]["status"] in ("pass", "warn") and runs[path]["status"] == "fail", check.paths
    clean = check_of(audit(build_clean(name), [suite]), suite, check_name)
    assert clean.status in ("pass", "warn"), clean.message


def test_a_leak_in_the_backward_only_fails_the_gradient_check() -> None:
    """The forward is exact (every forward check passes); the custom autograd function
    carries gradient from later tokens into earlier positions' loss. Before call paths no
    check differentiated anything, so nothing could see it."""
    result = audit(build("scratch_backward_leak"), ["causal"])
    statuses = {c.name: c.status for c in result.suite("causal").checks}
    assert statuses["future_tokens"] == "pass" and statuses["declared_pattern"] == "pass", statuses
    check = check_of(result, "causal", "future_gradients")
    assert check.status == "fail" and "training backward" in check.message and "gradient norm" in check.message
    assert check.max_diff > check.threshold and check.floor == 0.0
    assert check.paths == [{"path": "training_backward", "status": "fail", "cases": check.paths[0]["cases"]}]
    assert check_of(audit(build_clean("scratch_backward_leak"), ["causal"]), "causal", "future_gradients").status == (
        "pass"
    )


def test_packed_sequences_that_read_each_other_fail_the_packed_gradient_check() -> None:
    check = check_of(audit("mutant:packing_segments_ignored", ["packing"]), "packing", "packed_gradients")
    assert check.status == "fail" and "another sequence" in check.message
    clean = check_of(audit("ref:tiny-decoder", ["packing"], paths=("canonical",)), "packing", "packed_gradients")
    assert clean.status == "pass"


@pytest.mark.parametrize("name", ["gpt2", "llama", "bert", "bart"])
def test_clean_hugging_face_models_pass_their_gradient_checks(name: str) -> None:
    result = audit(HFAdapter(tiny_model(name)), ["causal", "padding"], paths=("canonical",))
    gradients = [c for s in result.suites for c in s.checks if c.name.endswith("_gradients")]
    assert gradients and all(c.status == "pass" for c in gradients), [(c.name, c.message) for c in gradients]


def test_every_check_states_its_paths_and_why_one_cannot_run() -> None:
    result = audit("ref:tiny-decoder", ["causal"])
    for check in result.suite("causal").checks:
        assert check.paths and check.paths[0]["path"] in ("canonical", "training_backward"), check.name
    future = check_of(result, "causal", "future_tokens")
    assert [run["path"] for run in future.paths] == [
        "canonical",
        "bare_call",
        "mask_of_ones",
        "default_cache",
        "training",
    ]
    default_cache = next(run for run in future.paths if run["path"] == "default_cache")
    assert default_cache["status"] == "not_run" and "already leaves" in default_cache["reason"]
    described = {p["path"]: p for p in result.environment["paths"]}
    assert described["default_cache"]["unavailable"] and described["training"]["unavailable"] is None


def test_randomness_outside_dropout_makes_the_training_path_unavailable_with_its_reason() -> None:
    """T5's attention dropout is a float in the config fed to functional dropout, not an
    nn.Dropout: setting every nn.Dropout to 0 leaves it, and two train-mode forwards differ."""
    adapter = HFAdapter(tiny_model("t5"))
    reason = next(a.reason for a in adapter.paths() if a.path == TRAINING)
    assert reason and "two train-mode forwards of one batch differ" in reason


def test_the_training_forward_leaves_the_model_as_it_found_it() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Dropout(0.3), torch.nn.BatchNorm1d(3)).eval()
    statistics = model[2].running_mean.clone()
    with torch.inference_mode(), training_forward(model):
        assert model.training and model[1].p == 0.0 and torch.is_grad_enabled()
        model(torch.tensor([[1, 2, 3], [3, 4, 5]])).sum().backward()
    assert not model.training and not model[2].training and model[1].p == 0.3
    assert torch.equal(model[2].running_mean, statistics)


def test_bare_and_mask_of_ones_change_only_plain_batches() -> None:
    adapter = adapter_for(WindowedMHADecoder())
    assert adapter.on_path(BARE_CALL) is adapter.on_path(BARE_CALL) and adapter.on_path(BARE_CALL) is not adapter
    assert adapter.on_path(BARE_CALL).on_path(MASK_OF_ONES) is adapter.on_path(MASK_OF_ONES)
    from maskcheck.harness.adapters.base import Batch
    from maskcheck.harness.adapters.paths import on_path

    ids = torch.ones(1, 4, dtype=torch.long)
    plain = Batch(ids, torch.ones_like(ids), torch.arange(4)[None])
    assert on_path(plain, BARE_CALL, 0).attention_mask is None and on_path(plain, BARE_CALL, 0).position_ids is None
    padded = Batch(ids, torch.tensor([[0, 1, 1, 1]]), torch.tensor([[0, 0, 1, 2]]))
    assert on_path(padded, BARE_CALL, 0) is padded and on_path(padded, MASK_OF_ONES, 0) is padded
    packed = Batch(ids, None, torch.tensor([[0, 1, 0, 1]]))  # positions restarting: packed, not plain
    assert on_path(packed, MASK_OF_ONES, 0) is packed
    assert on_path(Batch(ids), MASK_OF_ONES, 0).attention_mask.tolist() == [[1, 1, 1, 1]]


def test_a_path_that_would_make_the_canonical_calls_again_replays_nothing() -> None:
    """The padding suite's cases all carry a mask (padded rows, or rows alone with a mask of
    ones and default positions), so ``mask_of_ones`` would call the model with exactly the
    canonical arguments: the replayed cases' outcomes stand there, and the path runs no
    forward. The training path changes every call, so it replays them."""
    from maskcheck.harness.report.render import paths_text

    check = check_of(audit("ref:tiny-decoder", ["padding"]), "padding", "pad_ids")
    runs = {run["path"]: run for run in check.paths}
    assert runs["mask_of_ones"] == {"path": "mask_of_ones", "status": "pass", "cases": 0, "same_calls": 2}, runs
    assert runs["training"]["cases"] == 2 and "same_calls" not in runs["training"], runs
    assert "mask_of_ones PASS 0+2 same" in paths_text(check)


def test_the_paths_replay_the_batching_gates_cases_as_any_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate (padding/batch_composition) runs before the suites, and its result stands in
    the padding suite; its evaluated cases stand there too, so the call paths replay the most
    informative of them, not draws of their own: Hypothesis searches for it once."""
    from maskcheck.harness.engine import suite as engine

    searched: list[str] = []
    search = engine.CheckRun.search

    def recording(run: engine.CheckRun) -> None:
        searched.append(run.check.name)
        search(run)

    monkeypatch.setattr(engine.CheckRun, "search", recording)
    check = check_of(audit("ref:tiny-decoder", ["padding"]), "padding", "batch_composition")
    runs = {run["path"]: run for run in check.paths}
    assert searched.count("batch_composition") == 1, searched
    replayed = runs["mask_of_ones"]["cases"] + runs["mask_of_ones"].get("same_calls", 0)
    assert runs["training"]["cases"] == 2 and replayed == 2, runs


def test_a_call_differs_on_a_path_only_where_the_path_changes_its_arguments() -> None:
    """What decides whether a replayed case runs on a path: ``mask_of_ones`` changes a call
    without a mask, or with a mask of another dtype, and no call whose mask is ones already;
    the float32 twin changes every call, a cache's included."""
    from maskcheck.harness.adapters.base import Batch
    from maskcheck.harness.adapters.paths import CANONICAL, CallLog, changes_call

    ids = torch.ones(1, 4, dtype=torch.long)
    log = CallLog()
    log.note(CANONICAL, Batch(ids), 0)
    assert not log.same_on(MASK_OF_ONES) and log.same_on(BARE_CALL)
    assert not changes_call(MASK_OF_ONES, Batch(ids, torch.ones_like(ids)), 0)  # the same mask, the same call
    assert changes_call(MASK_OF_ONES, Batch(ids, torch.ones_like(ids, dtype=torch.bool)), 0)  # another dtype
    assert not CallLog().same_on(PATHS["float32_twin"])  # other weights answer every call, even a cache's


def test_the_report_shows_the_path_matrix(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from maskcheck.harness.report.render import render_markdown, render_table

    result = audit("ref:tiny-decoder", ["causal"])
    table = render_table(result, "ref:tiny-decoder", 1.0, verbose=True)
    assert "call paths: canonical, training_backward, bare_call, mask_of_ones, training" in table
    assert "call path default_cache not run: the canonical call already leaves" in table
    assert "paths: canonical PASS" in table
    markdown = render_markdown(result.to_dict())
    assert "## Call paths" in markdown and "| causal/future_tokens | PASS (" in markdown


def test_an_unknown_path_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown call path.*choose from canonical"):
        audit("ref:tiny-decoder", ["causal"], paths=("trainig",))


def test_a_bundle_of_a_path_failure_replays_on_its_path(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from maskcheck.harness.report.reproduction import load_bundle, replay

    result = audit("mutant:hf_llama_mask_dropped_default_cache", ["padding"], bundle_dir=tmp_path)
    bundle = result.suite("padding").reproduction
    assert bundle is not None
    records = {c["check"]: c for c in load_bundle(bundle)["checks"]}
    assert records["pad_ids"]["path"] == "default_cache"
    replayed = {r.check: r for r in replay(bundle)}
    assert replayed["pad_ids"].status == "fail"
