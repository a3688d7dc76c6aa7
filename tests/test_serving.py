"""The serving suite: each cache operation a server performs, against a fresh computation.

The seeded bugs (a rollback that keeps the position count, a reorder of the keys alone, a
reset that leaves a layer, and the same in transformers' own cache layers) are in the
mutant catalogue: tests/test_suites.py fails each on the check it names."""

from __future__ import annotations

import pytest
import torch

from maskcheck import audit
from maskcheck.harness.adapters.base import Batch, ServingUnsupported
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.serving import repeats_of, select_rows
from maskcheck.reference_models import PRESETS
from maskcheck.reference_models.hf_tiny import shrunk_model, tiny_model
from maskcheck.reference_models.mutants import MUTANTS
from maskcheck.reference_models.plain import plain_decoder
from maskcheck.reference_models.scratch import ScratchDecoder
from maskcheck.suites.serving_cases import row_index, steps

NEVER_FAILING = {"pass", "not_applicable"}


def checks(result) -> dict:  # type: ignore[no-untyped-def]
    return {c.name: c for c in result.suite("serving").checks}


def failing(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {name: c.message for name, c in checks(result).items() if c.status not in NEVER_FAILING}


@pytest.mark.parametrize("preset", sorted(p for p in PRESETS if PRESETS[p].family != "encoder"))
def test_clean_reference_models_pass_serving(preset: str) -> None:
    result = audit(f"ref:{preset}", ["serving"])
    assert not failing(result), failing(result)
    assert checks(result)["rollback"].status == "pass" and checks(result)["shared_prefix"].status == "pass"


@pytest.mark.parametrize("name", ["gpt2", "llama", "mistral", "t5"])
def test_clean_hugging_face_models_pass_serving(name: str) -> None:
    result = audit(HFAdapter(tiny_model(name)), ["serving"])
    assert not failing(result), failing(result)
    ran = {n for n, c in checks(result).items() if c.status == "pass"}
    assert {"rollback", "beam_reorder", "row_select", "row_repeat", "reuse", "shared_prefix", "static_cache"} <= ran


def test_a_hybrid_of_sliding_and_full_layers_is_decoded_past_its_window_and_rolled_back_across_it() -> None:
    """Gemma 2 slides on every other layer: the window to outgrow is a layer's, and rollback
    needs the sliding layers to record their past (as assisted decoding asks them)."""
    result = audit(HFAdapter(shrunk_model("gemma2", "causal-lm")), ["serving"], profile="dev")
    assert not failing(result), failing(result)
    eviction = checks(result)["window_eviction"]
    assert eviction.status == "pass" and "not checked" not in eviction.message, eviction.message
    assert checks(result)["rollback"].status == "pass"


def test_what_a_cache_declares_it_cannot_do_is_not_applicable_with_its_reason() -> None:
    """Mamba's state-space layers say they cannot be cropped and have no row selection; on a
    CPU the offloaded cache cannot run. Each says why, and what can run does."""
    by_name = checks(audit(HFAdapter(shrunk_model("mamba", "causal-lm")), ["serving"], profile="dev"))
    assert by_name["rollback"].status == "not_applicable"
    assert "is_croppable is False" in by_name["rollback"].message
    assert by_name["row_select"].status == "not_applicable" and "batch_select_indices" in by_name["row_select"].message
    assert by_name["beam_reorder"].status == "pass" and by_name["reuse"].status == "pass"
    assert by_name["offloaded_cache"].status == "not_applicable" and "CUDA" in by_name["offloaded_cache"].message
    assert (
        by_name["window_eviction"].status == "not_applicable"
        and "no sliding window" in by_name["window_eviction"].message
    )


def test_a_plain_module_without_a_protocol_method_gets_not_applicable_naming_it() -> None:
    """The gpt-fast shape keeps one request in its buffers: rollback and reuse follow input_pos
    (stale slots must be masked), it has no reorder_caches() and nothing to share."""
    by_name = checks(audit(ScratchDecoder(), ["serving"]))
    assert by_name["rollback"].status == "pass" and by_name["reuse"].status == "pass"
    assert by_name["beam_reorder"].status == "not_applicable" and "reorder_caches()" in by_name["beam_reorder"].message
    assert by_name["shared_prefix"].status == "not_applicable" and "own buffers" in by_name["shared_prefix"].message
    assert by_name["static_cache"].status == "not_applicable"


def test_the_reference_cache_is_immutable_so_there_is_nothing_to_reuse() -> None:
    by_name = checks(audit("ref:tiny-decoder", ["serving"]))
    assert by_name["reuse"].status == "not_applicable" and "immutable" in by_name["reuse"].message


@pytest.mark.parametrize(
    "mutant, check, blamed",
    [
        ("module_cache_rollback_keeps_position", "rollback", "the rollback breaks it"),
        ("hf_llama_reorder_keys_only", "beam_reorder", "the reorder breaks it"),
        ("kv_cache_positions_restart", "rollback", "the cache is wrong before any rollback"),
    ],
)
def test_a_failure_says_whether_the_operation_or_the_cache_before_it_is_wrong(
    mutant: str, check: str, blamed: str
) -> None:
    """The same decode without the operation decides: a seeded serving bug is the
    operation's; a kv_cache bug shows without it, and kv_cache's incremental check names it."""
    failure = checks(audit(f"mutant:{mutant}", ["serving"]))[check]
    assert failure.status == "fail" and blamed in failure.message, failure.message


@pytest.mark.parametrize("name", ["module_cache_reset_keeps_last_layer", "module_cache_reorder_keys_only"])
def test_a_seeded_serving_bug_fails_only_the_operation_it_breaks(name: str) -> None:
    result = audit(f"mutant:{name}", ["serving"])
    assert set(failing(result)) == {MUTANTS[name].check}, failing(result)


def test_reuse_is_judged_by_influence_of_the_previous_request() -> None:
    """The reset that keeps a layer moves the next request's logits when the previous request's
    ids change: reuse fails at floor 0 with the exact measured difference."""
    reuse = checks(audit("mutant:module_cache_reset_keeps_last_layer", ["serving"]))["reuse"]
    assert reuse.status == "fail" and reuse.floor == 0.0 and reuse.max_diff > reuse.threshold > 0


def test_row_indices_rearrange_something_and_repeat_in_place() -> None:
    for seed in range(20):
        reorder = row_index("reorder", 3, seed)
        assert reorder.numel() == 3 and not torch.equal(reorder, torch.arange(3))
        select = row_index("select", 3, seed)
        assert 1 <= select.numel() < 3 and len(set(select.tolist())) == select.numel()
    repeated = row_index("repeat", 2, 1)
    assert repeats_of(repeated, 2) == 3 and repeated.tolist() == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="repeat_interleave"):
        repeats_of(torch.tensor([1, 0]), 2)
    assert all(sum(steps(n, seed)) == n and max(steps(n, seed)) <= 4 for n in (1, 5, 13) for seed in (0, 7))


def test_rows_of_a_state_are_selected_inside_containers_and_nothing_else() -> None:
    mask, other = torch.arange(6).reshape(2, 3), torch.zeros(5)
    selected = select_rows({"mask": mask, "pair": (mask, other), "flag": True}, torch.tensor([1, 1]), 2)
    assert selected["mask"].tolist() == [[3, 4, 5], [3, 4, 5]] and selected["pair"][1] is other
    assert selected["flag"] is True


def test_an_adapter_without_serving_operations_says_so() -> None:
    """A plain decoder keeps every method; one whose class lacks rollback() cannot roll back."""
    from maskcheck.harness.adapters.specs import adapter_for

    class NoRollback(type(plain_decoder())):  # type: ignore[misc]
        rollback = None  # type: ignore[assignment]

    torch.manual_seed(0)
    adapter = adapter_for(NoRollback().eval())
    ids = torch.tensor([[3, 4, 5]])
    _, state = adapter.prefill(Batch(ids, torch.ones_like(ids)), rollback=True)
    with pytest.raises(ServingUnsupported, match="no rollback"):
        adapter.rollback(state, 1)


def test_the_repeated_fresh_decode_runs_only_where_the_judgement_at_floor_zero_is_not_a_pass() -> None:
    """A pass at floor 0 is a pass at any floor: the second fresh decode, which measures the
    floor, is made only for a case that does not pass without it, and a leak larger than
    that floor still fails."""
    from maskcheck.harness.adapters.memo import memo_enabled
    from maskcheck.harness.engine.suite import RunContext
    from maskcheck.harness.engine.tolerance import tolerance_for
    from maskcheck.suites.serving_cases import same_computation

    context = RunContext(tolerance=tolerance_for("cpu", "float32"))
    fresh = torch.randn(2, 3, 11, generator=torch.Generator().manual_seed(0))
    tilt = torch.linspace(0, 1, 11)  # a change of the log-probabilities (a constant one would normalise away)
    repeats: list[int] = []

    def again(noise: float) -> torch.Tensor:
        assert not memo_enabled()  # the repeat is the measurement: computed, never served
        repeats.append(1)
        return fresh + noise * tilt

    same = same_computation(context, fresh, lambda: again(0.0), [(fresh.clone(), "same")])
    assert same.status == "pass" and not repeats
    rounded = same_computation(context, fresh, lambda: again(1e-3), [(fresh + 1e-3 * tilt, "rounding")])
    assert rounded.status == "pass" and rounded.floor > 0 and repeats == [1]
    leaked = same_computation(context, fresh, lambda: again(1e-3), [(fresh + 0.5 * tilt, "a leak")])
    assert leaked.status == "fail" and "a leak" in leaked.message and repeats == [1, 1]


@pytest.mark.parametrize("copies_states", [True, False])
def test_reuse_repeats_its_fresh_decode_before_other_requests_unless_the_model_keeps_no_state_of_its_own(
    copies_states: bool,
) -> None:
    """The floor's repeat of the fresh decode runs before the reused requests where the state
    may live outside what a decode returns; where the fresh decode was measured to keep
    nothing elsewhere (a state the adapter copies whole, modules unchanged), it runs only if
    the judgement at floor 0 is not a pass, and on this clean model it is a pass."""
    from maskcheck.harness.engine.suite import RunContext
    from maskcheck.harness.engine.tolerance import tolerance_for
    from maskcheck.suites.serving import ReuseCase, ServingSuite
    from maskcheck.suites.serving_cases import ServingBatches

    adapter = HFAdapter(tiny_model("gpt2", "eager"))
    adapter.copies_states = copies_states
    forwards = []
    adapter.model.register_forward_hook(lambda *_: forwards.append(1))
    case = ReuseCase(first_lengths=(3,), second_lengths=(2, 2, 2), first_steps=0, steps=2, source_padding=0, seed=0)
    context = RunContext(tolerance=tolerance_for("cpu", "float32"))
    outcome = ServingSuite().reuse(ServingBatches(adapter), context, case)
    assert outcome.status == "pass" and outcome.floor == 0.0
    # a fresh decode is a prefill and 2 steps; each reused request a prefill, a refill and 2 steps
    assert len(forwards) == 3 + 2 * 4 + (0 if copies_states else 3)
