"""The state suites: kv_cache, packing and norm_checkpoint.

Clean models pass (or warn for a documented reason); the seeded bugs of these suites are
covered with the mask suites' bugs in test_suites.py. The norm_checkpoint tests train two
small models (pre-norm and post-norm) so that the weights carry signal.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from maskcheck import audit
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.specs import LoadOptions, adapter_for, load_adapter
from maskcheck.harness.engine.batching import run_alone
from maskcheck.harness.engine.registry import suite_names
from maskcheck.harness.engine.suite import RunContext
from maskcheck.harness.engine.tolerance import tolerance_for
from maskcheck.reference_models import PRESETS, ModelConfig, save_checkpoint
from maskcheck.reference_models.hf_tiny import tiny_model
from maskcheck.reference_models.training import TrainingRun, train
from maskcheck.suites.packing import PackedCase, PackingSuite

STATE_SUITES = suite_names(lambda suite: suite.kind == "state")  # packing, kv_cache, norm_checkpoint


def statuses(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {f"{s.name}/{c.name}": c.status for s in result.suites for c in s.checks}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_clean_reference_models_pass_the_cache_and_packing_suites(preset: str) -> None:
    result = audit(f"ref:{preset}", ["packing", "kv_cache"])
    assert {s.status for s in result.suites} <= {"pass", "not_applicable"}, statuses(result)


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "mistral", "t5"])
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_clean_hugging_face_models_pass_kv_cache(name: str, implementation: str) -> None:
    suite = audit(HFAdapter(tiny_model(name, implementation)), ["kv_cache"]).suite("kv_cache")
    assert suite.status == "pass", statuses_of(suite)


def statuses_of(suite) -> list:  # type: ignore[no-untyped-def]
    return [(c.name, c.status, c.message) for c in suite.checks]


def test_bart_decoder_positions_do_not_follow_left_padding() -> None:
    """BART's decoder takes no position ids: left-padded generation shifts them (warn, not a leak)."""
    suite = audit(HFAdapter(tiny_model("bart")), ["kv_cache"]).suite("kv_cache")
    checks = {c.name: c for c in suite.checks}
    assert checks["incremental"].status == "pass"
    assert checks["greedy_generation"].status == "warn" and "left padding shifts" in checks["greedy_generation"].message


#: how the settings check begins where only the documented padding-free setting isolates
SAFE_ONLY_DOCUMENTED = (
    "packing is safe with: position_ids restarting at 0 per sequence, no attention_mask, use_cache=False."
)


@pytest.mark.parametrize("name", ["gpt2", "llama", "qwen2", "mistral"])
def test_hugging_face_packing_is_safe_only_with_use_cache_false_and_no_mask(name: str) -> None:
    """A finding on transformers 5.x: the padding-free path builds its block-diagonal mask only
    when no attention_mask and no cache are passed, and forward creates a cache whenever
    use_cache is left at config.use_cache=True."""
    suite = audit(HFAdapter(tiny_model(name, "sdpa")), ["packing"]).suite("packing")
    checks = {c.name: c for c in suite.checks}
    for name_ in ("segment_isolation", "segments_alone", "packed_vs_padded"):
        assert checks[name_].status == "pass", statuses_of(suite)
    message = checks["settings"].message
    assert checks["settings"].status == "warn"
    assert message.startswith(SAFE_ONLY_DOCUMENTED)
    assert "use_cache left at its default" in message and "attention_mask of ones" in message


def test_packing_settings_run_each_sequence_alone_once_and_judge_every_setting_against_it() -> None:
    """The settings check compares every setting's packed row with one run of each sequence
    alone, under the documented setting; a setting that leaks is still named."""
    adapter = HFAdapter(tiny_model("gpt2", "sdpa"))
    settings = adapter.packing_settings()
    assert len(settings) == 3
    context = RunContext(tolerance=tolerance_for("cpu", "float32"), examples=3, profile="ci")
    case = PackedCase(segment_lengths=(3, 4), changed=0, padding=0, seed=7)
    lengths: list[int] = []
    kind = type(adapter.model)
    forward = kind.forward

    def counted(module: Any, *args: Any, **kwargs: Any) -> Any:
        lengths.append(kwargs["input_ids"].shape[-1])
        return forward(module, *args, **kwargs)

    kind.forward = counted  # type: ignore[method-assign]
    try:
        outcome = run_alone(PackingSuite().settings(settings, context, case))
    finally:
        kind.forward = forward  # type: ignore[method-assign]
    assert sorted(n for n in lengths if n < 7) == [3, 4]  # each sequence alone, once
    assert outcome.status == "warn"
    assert outcome.message.startswith(SAFE_ONLY_DOCUMENTED)
    assert "use_cache left at its default" in outcome.message and "attention_mask of ones" in outcome.message


def test_bert_has_no_padding_free_path() -> None:
    """The finding behind BERT's "not safe to pack": position ids restarting per sequence, no
    attention mask, and still both sequences attend to each other (the bidirectional mask ignores them)."""
    model = tiny_model("bert", "sdpa")
    first, second = torch.tensor([[5, 6, 7, 8, 9]]), torch.tensor([[10, 11, 12, 13]])
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3]])
    with torch.no_grad():
        packed = model(input_ids=torch.cat([first, second], 1), position_ids=positions).logits
        alone = model(input_ids=second, position_ids=positions[:, 5:]).logits
    assert (packed[0, 5:] - alone[0]).abs().max() > 1e-4
    packing = audit(HFAdapter(model), ["packing"]).suite("packing")
    assert packing.status == "warn" and packing.checks[0].message.startswith("not safe to pack")


def test_kv_cache_failure_names_the_step() -> None:
    check = audit("mutant:kv_cache_chunk_sees_its_future", ["kv_cache"]).suite("kv_cache").checks[0]
    assert check.case == {"prompt_lengths": (1,), "chunks": (2,), "source_padding": 0, "seed": 0}
    assert "first wrong position 1, in the step of 2 token(s) starting at position 1" in check.message


# -- a stateful test of the reference cache through the adapter ---------------------------------


class CacheMachine(RuleBasedStateMachine):
    """Prefill, append chunks, fork and keep appending: the logits always match a full forward."""

    def __init__(self) -> None:
        super().__init__()
        self.adapter = load_adapter("ref:tiny-decoder-sliding")  # window 4, so the sequence outgrows it
        self.tokens: torch.Tensor | None = None
        self.logits: list[torch.Tensor] = []

    @initialize(length=st.integers(1, 6), seed=st.integers(0, 1000))
    def prefill(self, length: int, seed: int) -> None:
        from maskcheck.harness.adapters.base import Batch

        self.tokens = torch.randint(1, 64, (1, length), generator=torch.Generator().manual_seed(seed))
        logits, self.state = self.adapter.prefill(Batch(self.tokens, torch.ones_like(self.tokens)))
        self.logits = [logits]

    @rule(n=st.integers(1, 4), seed=st.integers(0, 1000), fork=st.booleans())
    def append(self, n: int, seed: int, fork: bool) -> None:
        assert self.tokens is not None
        if self.tokens.shape[1] + n > 40:
            return
        new = torch.randint(1, 64, (1, n), generator=torch.Generator().manual_seed(seed))
        state = self.adapter.fork(self.state) if fork else self.state
        logits, self.state = self.adapter.step(state, new)
        self.tokens = torch.cat([self.tokens, new], dim=1)
        self.logits.append(logits)

    @invariant()
    def matches_full_forward(self) -> None:
        if self.tokens is None:
            return
        from maskcheck.harness.adapters.base import Batch

        full = self.adapter.logits(Batch(self.tokens, torch.ones_like(self.tokens)))
        torch.testing.assert_close(torch.cat(self.logits, dim=1), full, atol=2e-5, rtol=0)


TestCacheMachine = CacheMachine.TestCase
TestCacheMachine.settings = settings(max_examples=15, stateful_step_count=6, deadline=None)


# -- norm_checkpoint on trained weights ---------------------------------------------------------

TRAINED = {
    layout: TrainingRun(
        ModelConfig(norm_layout=layout, final_norm=layout == "pre", token_shift=True, d_model=64),
        "copy_spans",
        steps=700,
        seed=0,
    )
    for layout in ("pre", "post")
}


@pytest.fixture(scope="session")
def trained_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A pre-norm and a post-norm decoder, trained to continue recurring spans (about 12 s each).

    Each model is trained once per test run: pytest-xdist workers share the directory above
    their own temporary ones, a lock per model keeps two workers from training the same one,
    and each worker starts with a different model so two workers train both in parallel.
    """
    from filelock import FileLock

    # Read from the environment, not the worker_id fixture, so the tests also run without pytest-xdist.
    worker_id = os.environ.get("PYTEST_XDIST_WORKER", "master")
    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    layouts = list(TRAINED)
    start = int(worker_id.removeprefix("gw")) % len(layouts) if worker_id != "master" else 0
    paths = {}
    for layout in layouts[start:] + layouts[:start]:
        path = shared / f"trained-{layout}.safetensors"
        with FileLock(str(path) + ".lock"):
            if not path.exists():
                partial = save_checkpoint(train(TRAINED[layout]), shared / f"trained-{layout}.partial.safetensors")
                partial.replace(path)  # atomic: another worker never reads half a checkpoint
        paths[layout] = path
    return paths


def norm_checks(spec_or_model, **overrides) -> dict:  # type: ignore[no-untyped-def]
    if isinstance(spec_or_model, str):
        spec_or_model = load_adapter(spec_or_model, LoadOptions(overrides=overrides))
    suite = audit(spec_or_model, ["norm_checkpoint"]).suite("norm_checkpoint")
    return {c.name: c for c in suite.checks}


@pytest.mark.slow  # trains two small models first (about a minute)
@pytest.mark.parametrize("layout", ["pre", "post"])
def test_trained_checkpoint_passes_under_its_own_layout(trained_checkpoints, layout: str) -> None:  # type: ignore[no-untyped-def]
    checks = norm_checks(f"ref:{trained_checkpoints[layout]}")
    assert [checks[n].status for n in ("metadata", "fingerprint", "behaviour")] == ["pass"] * 3, checks


@pytest.mark.slow  # trains two small models first (about a minute)
@pytest.mark.parametrize("layout,other", [("pre", "post"), ("post", "pre")])
def test_behaviour_alone_identifies_the_layout_of_trained_weights(trained_checkpoints, layout: str, other: str) -> None:  # type: ignore[no-untyped-def]
    """No metadata, no fingerprint: the weights in memory, declared under the wrong layout."""
    from maskcheck.reference_models import load_checkpoint

    adapter = adapter_for(load_checkpoint(trained_checkpoints[layout]))
    assert adapter.checkpoint is None
    assert norm_checks(adapter)["behaviour"].status == "pass"
    wrong = norm_checks(adapter.relayout(norm_layout=other))
    assert wrong["metadata"].status == "not_applicable" and wrong["fingerprint"].status == "not_applicable"
    behaviour = wrong["behaviour"]
    assert behaviour.status == "fail"
    assert behaviour.message.startswith(f"the weights fit norm_layout={layout} (probe loss")
    assert f"not the declared layout norm_layout={other}" in behaviour.message


@pytest.mark.slow  # trains two small models first (about a minute)
def test_override_forcing_another_layout_fails_with_every_kind_of_evidence(trained_checkpoints) -> None:  # type: ignore[no-untyped-def]
    checks = norm_checks(f"ref:{trained_checkpoints['pre']}", norm_layout="post")
    assert {n: c.status for n, c in checks.items()} == {
        "load": "not_applicable",
        "metadata": "fail",
        "fingerprint": "fail",
        "behaviour": "fail",
    }
    assert "norm_layout: trained with 'pre', running with 'post'" in checks["metadata"].message
    assert (
        "recorded layout: norm_layout=pre" in checks["fingerprint"].message
        and "running: norm_layout=post" in checks["fingerprint"].message
    )
    assert checks["behaviour"].message.startswith("the weights fit norm_layout=pre")


@pytest.mark.slow  # trains two small models first (about a minute)
def test_position_scheme_mismatch_is_caught(trained_checkpoints) -> None:  # type: ignore[no-untyped-def]
    """Rotary weights loaded as learned-absolute: the position table is missing and keeps its init."""
    checks = norm_checks(f"ref:{trained_checkpoints['pre']}", position="learned")
    assert "position: trained with 'rotary', running with 'learned'" in checks["metadata"].message
    assert checks["fingerprint"].status == "fail"
    assert checks["behaviour"].status == "fail" and checks["behaviour"].message.startswith(
        "the weights fit position=rotary"
    )


def test_untrained_weights_are_inconclusive(tmp_path: Path) -> None:
    from maskcheck.reference_models import Transformer

    torch.manual_seed(0)
    path = save_checkpoint(Transformer(ModelConfig()), tmp_path / "untrained.safetensors")
    checks = norm_checks(f"ref:{path}")
    assert checks["metadata"].status == "pass" and checks["fingerprint"].status == "pass"
    assert checks["behaviour"].status == "warn" and checks["behaviour"].message.startswith("inconclusive")
    # The fingerprint alone catches a wrong layout even when behaviour cannot.
    assert norm_checks(f"ref:{path}", norm_unit_offset=False, norm="rmsnorm")["fingerprint"].status == "fail"


def test_a_hugging_face_model_object_has_behaviour_evidence_only() -> None:
    """No checkpoint to compare with: load, metadata and fingerprint say why; the weights are
    still rebuilt under the variants they fit (random ones are inconclusive:
    tests/test_hf_layout.py has trained ones)."""
    suite = audit(HFAdapter(tiny_model("llama")), ["norm_checkpoint"]).suite("norm_checkpoint")
    checks = {c.name: c for c in suite.checks}
    assert checks["load"].message == "the model was not loaded from a checkpoint directory"
    assert checks["metadata"].status == checks["fingerprint"].status == "not_applicable"
    assert checks["behaviour"].status == "warn" and checks["behaviour"].message.startswith("inconclusive")


@pytest.mark.slow  # trains two small models first (about a minute)
@pytest.mark.parametrize(
    "field,value", [("final_norm", "false"), ("norm", "rmsnorm"), ("position", "alibi"), ("norm_layout", "post")]
)
def test_every_forced_layout_field_fails_metadata_and_fingerprint(trained_checkpoints, field: str, value: str) -> None:  # type: ignore[no-untyped-def]
    checks = norm_checks(f"ref:{trained_checkpoints['pre']}", **{field: value})
    assert checks["metadata"].status == "fail" and f"{field}: trained with" in checks["metadata"].message
    assert checks["fingerprint"].status == "fail"
