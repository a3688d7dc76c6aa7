"""Cases sharing forwards: what stacks, what never does, and that verdicts do not move."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from verdict_record import RECORD

from maskcheck import audit
from maskcheck.harness.adapters.base import Batch
from maskcheck.harness.adapters.specs import adapter_for
from maskcheck.harness.engine.batching import (
    FORWARD_COST_TOKENS,
    Greedy,
    Logits,
    answer,
    greedy,
    plan,
    plan_decodings,
    run_alone,
    run_together,
    widen,
)
from maskcheck.harness.engine.cases import RowBatches
from maskcheck.reference_models import PRESETS, Transformer
from maskcheck.reference_models.mutants import build


@pytest.fixture(scope="module")
def decoder() -> Any:
    torch.manual_seed(0)
    return adapter_for(Transformer(PRESETS["tiny-decoder"]).eval())


def padded(adapter: Any, lengths: tuple[int, ...], length: int, side: str) -> Batch:
    rows = RowBatches(adapter)
    return rows.batch(rows.rows(lengths, seed=len(lengths) + length), length, side)


def test_requests_keep_their_attention_path(decoder: Any) -> None:
    """No mask, a mask of ones and padded rows never share a forward, nor left with right
    padding: some backends take another path for each. Padded rows of one side stack
    across lengths; the others only at equal lengths."""
    row = ids((2, 6), seed=0)
    requests = {
        "no mask": Logits(decoder, Batch(row)),
        "no mask, same length": Logits(decoder, Batch(row.clone())),
        "no mask, other length": Logits(decoder, Batch(row[:, :4])),
        "ones": Logits(decoder, Batch(row, torch.ones_like(row))),
        "left 6": Logits(decoder, padded(decoder, (3, 6), 6, "left")),
        "left 8": Logits(decoder, padded(decoder, (2, 5), 8, "left")),
        "right 7": Logits(decoder, padded(decoder, (4,), 7, "right")),
    }
    groups = sorted(sorted(g) for g in plan(requests))
    assert groups == sorted(
        [["no mask", "no mask, same length"], ["no mask, other length"], ["ones"], ["left 6", "left 8"], ["right 7"]]
    )


def test_stacking_across_lengths_stops_where_padding_costs_more_than_a_forward(decoder: Any) -> None:
    short = padded(decoder, (1,), 2, "right")
    long = padded(decoder, (30,), 40, "right")
    requests = {"short": Logits(decoder, short), "long": Logits(decoder, long)}
    assert 1 * (40 - 2) > FORWARD_COST_TOKENS  # padding the short row to 40 costs more than its own forward
    assert sorted(sorted(g) for g in plan(requests)) == [["long"], ["short"]]
    near = padded(decoder, (30,), 36, "right")
    assert sorted(sorted(g) for g in plan({"near": Logits(decoder, near), "long": Logits(decoder, long)})) == [
        ["long", "near"]
    ]


@pytest.mark.parametrize("side", ["left", "right"])
def test_a_widened_batch_gives_its_rows_the_same_logits(decoder: Any, side: str) -> None:
    batch = padded(decoder, (3, 5), 6, side)
    wide = widen(batch, 9, side, decoder)
    assert wide.input_ids.shape == (2, 9) and int(wide.attention_mask.sum()) == int(batch.attention_mask.sum())
    columns = slice(3, 9) if side == "left" else slice(0, 6)
    real = batch.attention_mask.bool()
    torch.testing.assert_close(decoder.logits(wide)[:, columns][real], decoder.logits(batch)[real], atol=1e-5, rtol=0)


def test_left_padded_decodings_share_one_across_lengths_and_the_others_keep_their_shape(decoder: Any) -> None:
    """Greedy decodings of left-padded prompts stack across lengths, widened on the left;
    an unpadded prompt (mask of ones) is never widened into padding, and a short prompt is
    not padded to a long one where the padding costs more than the steps it saves."""
    requests = {
        "left 6": Greedy(decoder, padded(decoder, (3, 6), 6, "left"), 5),
        "left 8": Greedy(decoder, padded(decoder, (2, 5), 8, "left"), 3),
        "left 40": Greedy(decoder, padded(decoder, (30, 2, 3), 40, "left"), 2),
        "ones 6": Greedy(decoder, Batch(ids((2, 6), seed=1), torch.ones(2, 6, dtype=torch.long)), 4),
        "ones 7": Greedy(decoder, Batch(ids((1, 7), seed=2), torch.ones(1, 7, dtype=torch.long)), 4),
    }
    assert 4 * (40 - 8) > 2 * FORWARD_COST_TOKENS  # 4 short rows padded to 40 cost more than the 2 forwards saved
    groups = sorted(sorted(g) for g in plan_decodings(requests))
    assert groups == [["left 40"], ["left 6", "left 8"], ["ones 6"], ["ones 7"]]


def test_a_stacked_decoding_gives_each_prompt_its_own_tokens_and_logits(decoder: Any) -> None:
    requests = {
        "left 6": Greedy(decoder, padded(decoder, (3, 6), 6, "left"), 5),
        "left 8": Greedy(decoder, padded(decoder, (2, 5), 8, "left"), 3),
    }
    steps = []
    original = decoder.step
    decoder.step = lambda *args: steps.append(1) or original(*args)  # type: ignore[method-assign]
    try:
        replies = answer(requests)
    finally:
        del decoder.step
    assert len(steps) == 5 - 1  # one decoding, as long as the longest asks
    for key, request in requests.items():
        tokens, logits = replies[key]
        alone_tokens, alone_logits = greedy(decoder, request.batch, request.new_tokens)
        assert torch.equal(tokens, alone_tokens)
        torch.testing.assert_close(logits, alone_logits, atol=STACKED_ATOL, rtol=0)


def ids(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(1, 50, shape, generator=torch.Generator().manual_seed(seed))


def real_logits(logits: torch.Tensor, batch: Batch) -> torch.Tensor:
    """The logits at real positions (a padded slot's logits are nobody's business)."""
    real = (
        torch.ones_like(batch.input_ids, dtype=torch.bool)
        if batch.attention_mask is None
        else batch.attention_mask.bool()
    )
    return logits[real]


def evaluation(adapter: Any, batches: list[Batch]) -> Any:
    """Asks for each batch's logits in turn (the last two together) and returns them at real positions."""
    first = yield Logits(adapter, batches[0])
    rest = yield [Logits(adapter, b) for b in batches[1:]]
    return [real_logits(first, batches[0])] + [real_logits(r, b) for r, b in zip(rest, batches[1:])]


#: logits of the tiny decoder are of order 1; a forward of other rows beside them (another
#: batch size, so other kernels' blocking) moves them by float32 rounding, about 1e-7, on
#: any CPU and thread count. Compared element by element: a sum of logits near zero has
#: no relative tolerance that holds across machines.
STACKED_ATOL = 1e-5


def test_lockstep_gives_each_evaluation_its_own_logits_in_fewer_forwards(decoder: Any) -> None:
    plans = [
        [
            padded(decoder, (n, 2), 5 + n % 3, "left"),
            padded(decoder, (n,), n + 1, "right"),
            Batch(ids((1, 4), seed=n)),
        ]
        for n in range(1, 6)
    ]
    alone = [run_alone(evaluation(decoder, p)) for p in plans]
    decoder.forward_memo.clear()  # else every request is a call made already: served, not stacked
    calls = []
    original = decoder.logits
    decoder.logits = lambda batch: calls.append(batch.size) or original(batch)  # type: ignore[method-assign]
    try:
        together = run_together([evaluation(decoder, p) for p in plans])
    finally:
        del decoder.logits
    assert len(calls) < sum(len(p) for p in plans)
    for a, t in zip(alone, together):
        for one, stacked in zip(a, t):
            torch.testing.assert_close(stacked, one, atol=STACKED_ATOL, rtol=0)


def test_each_case_logs_the_calls_another_path_would_change_though_its_rows_are_stacked(decoder: Any) -> None:
    """The stacked forward is nobody's call: each request is noted for its own case, as it
    asked, so a case's log says which paths would call the model otherwise for it."""
    from maskcheck.harness.adapters.paths import CallLog

    row = ids((1, 4), seed=3)
    both_padded = [padded(decoder, (2, 4), 5, "left"), padded(decoder, (3,), 5, "left")]
    padded_and_bare = [padded(decoder, (1, 3), 5, "left"), Batch(row)]
    ones = Batch(row, torch.ones_like(row), torch.arange(4)[None])
    padded_and_ones = [padded(decoder, (4,), 5, "left"), ones]
    logs = [CallLog(), CallLog(), CallLog()]
    run_together([evaluation(decoder, p) for p in (both_padded, padded_and_bare, padded_and_ones)], logs=logs)
    every_call = {"default_cache", "training", "float32_twin"}  # a mode, a cache setting, other weights
    assert logs[0].changed == every_call  # padded rows keep their mask on every path
    assert logs[1].changed == every_call | {"mask_of_ones"}  # a call without a mask is already bare
    assert logs[2].changed == every_call | {"bare_call"}  # a mask of ones already is one


def test_one_case_that_raises_leaves_the_others_their_outcomes(decoder: Any) -> None:
    class Broken:
        capabilities = decoder.capabilities

        def logits(self, batch: Batch) -> torch.Tensor:
            raise RuntimeError("this model raises")

        def remembers(self, batch: Batch, keep: int | None = None) -> bool:
            return False

        def remember(self, batch: Batch, keep: int | None, logits: torch.Tensor) -> None:
            pass

    def raising() -> Any:
        yield Logits(Broken(), Batch(torch.ones(1, 3, dtype=torch.long)))

    good = [padded(decoder, (2,), 3, "left"), padded(decoder, (3,), 4, "left"), padded(decoder, (1,), 3, "left")]
    results = run_together([evaluation(decoder, good), raising(), evaluation(decoder, good)])
    assert isinstance(results[1], RuntimeError) and "this model raises" in str(results[1])
    for first, again in zip(results[0], results[2]):
        torch.testing.assert_close(first, again, atol=STACKED_ATOL, rtol=0)


def test_the_report_says_whether_cases_shared_forwards() -> None:
    on = audit("ref:tiny-decoder", ["padding", "causal"], profile="dev")
    assert on.environment["batching"].startswith(
        "on: cases of a check share forwards (padding/batch_composition passed on"
    )
    off = audit("ref:tiny-decoder", ["causal"], profile="dev")
    assert off.environment["batching"].startswith("off: the padding suite")
    unasked = audit("ref:tiny-decoder", ["padding"], profile="dev", batch_cases=False)
    assert unasked.environment["batching"].startswith("off: every case has forwards of its own")


def test_the_command_line_can_ask_for_one_case_per_forward(tmp_path: Any) -> None:
    from maskcheck.harness.cli import main

    report = tmp_path / "report.json"
    assert (
        main(
            ["audit", "ref:tiny-decoder", "-q", "--suites", "padding", "--one-case-per-forward", "--json", str(report)]
        )
        == 0
    )
    assert json.loads(report.read_text())["environment"]["batching"].startswith(
        "off: every case has forwards of its own"
    )


def test_a_model_whose_rows_read_each_other_gets_one_case_per_forward() -> None:
    """The gate: rows masked with another row's padding fail batch_composition, so no case
    shares a forward, the report says why, and the padding suite reports the gate's run."""
    result = audit(build("padding_mask_of_last_row"), ["padding"], profile="dev")
    assert result.environment["batching"].startswith("off: padding/batch_composition did not pass (fail)")
    check = next(c for c in result.suite("padding").checks if c.name == "batch_composition")
    assert check.status == "fail" and "row 0 changed when the other rows changed" in check.message


@pytest.mark.slow  # 51 audits in one process (minutes): run by `make test-slow`, not by CI's 20-minute run
def test_verdicts_cases_and_shrunk_examples_are_those_of_the_engine_before_batching() -> None:
    """tests/data/verdicts.json was recorded by the engine before cases shared forwards
    (one case per forward, every copy run): statuses, the shrunk case of every failure, the
    case of every warn and the cases every other check evaluated must be the same. In a
    process of its own, as it was recorded (tests/verdict_record.py says how)."""
    import subprocess
    import sys

    script = Path(__file__).with_name("verdict_record.py")
    done = subprocess.run([sys.executable, str(script), "--compare"], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    from maskcheck.reference_models.mutants import MUTANTS

    unbuildable = sum(f"mutant:{name}" in json.loads(RECORD.read_text()) for name, m in MUTANTS.items() if m.missing())
    assert f"{len(json.loads(RECORD.read_text())) - unbuildable} of " in done.stdout  # torchtune's: in its own venv


def assert_each_request_got_its_own(
    adapter: Any, batches: list[Batch], keeps: list[int | None], replies: dict[int, torch.Tensor]
) -> None:
    """Request ``i``'s reply is the logits of ``batches[i]`` run alone, its last ``keeps[i]`` positions."""
    for i, (batch, keep) in enumerate(zip(batches, keeps)):
        full = adapter.logits(batch)  # [B, T, V]
        expected = full if keep is None else full[:, -keep:]
        assert replies[i].shape == expected.shape
        torch.testing.assert_close(replies[i], expected, atol=STACKED_ATOL, rtol=0)


def test_requests_for_the_last_positions_stack_and_each_gets_its_own(decoder: Any) -> None:
    """Left-padded and unpadded requests that keep their last positions share forwards (the
    widest keep of a group) and each gets its own last positions; right-padded ones are not
    widened, since widening on the right would move their last positions."""
    batches = [
        padded(decoder, (3, 2), 3, "left"),
        padded(decoder, (4, 2), 5, "left"),
        Batch(ids((1, 4), seed=1)),
        Batch(ids((1, 4), seed=2)),
        padded(decoder, (2, 3), 3, "right"),
        padded(decoder, (2, 4), 4, "right"),
    ]
    keeps = [2, 1, 3, 2, 2, None]
    requests = {i: Logits(decoder, b, k) for i, (b, k) in enumerate(zip(batches, keeps))}
    assert sorted(sorted(g) for g in plan(requests)) == [[0, 1], [2, 3], [4], [5]]
    replies = answer(requests)
    assert_each_request_got_its_own(decoder, batches, keeps, replies)


def test_a_same_shape_pair_is_remembered_row_by_row_only_where_rows_may_share_forwards(decoder: Any) -> None:
    """``one_forward``: where stacking is licensed the pair is two requests the engine runs
    as one forward and remembers one by one, so a later request for either is served; where
    it is not, the pair is the one batch asked for, and its halves are nobody's call."""
    from maskcheck.harness.engine.batching import one_forward, stacking

    base, other = Batch(ids((2, 5), seed=7)), Batch(ids((2, 5), seed=8))
    calls: list[int] = []
    original = decoder.logits
    decoder.logits = lambda batch, keep=None: calls.append(batch.size) or original(batch, keep)  # type: ignore[method-assign]
    try:
        for licensed, forwards in ((False, [4]), (True, [4])):
            decoder.forward_memo.clear()
            calls.clear()
            with stacking(licensed):
                pair = run_alone(one_forward(decoder, [base, other]))  # [4, 5, V]
                assert calls == forwards  # one forward of both, either way
                assert decoder.remembers(base) is licensed
            decoder.forward_memo.clear()
            alone = original(base)  # [2, 5, V], its own forward
            torch.testing.assert_close(pair[:2], alone, atol=STACKED_ATOL, rtol=0)
    finally:
        del decoder.logits


def test_unpadded_rows_of_other_lengths_stack_extended_only_where_licensed(decoder: Any) -> None:
    """Where the model's causality licenses it (``extending``), unpadded rows of other
    lengths share one forward, each lengthened with real tokens (no padding, the same kind
    of call), and each gets back its own positions, whole or its last ``keep``; without
    the licence they stack at equal lengths only (as test_requests_keep_their_attention_path)."""
    from maskcheck.harness.engine.batching import extended, extending

    batches = [
        Batch(ids((2, 6), seed=1)),
        Batch(ids((1, 3), seed=2)),
        Batch(ids((1, 5), seed=3), torch.ones(1, 5, dtype=torch.long)),
        Batch(ids((2, 4), seed=4), torch.ones(2, 4, dtype=torch.long)),
        Batch(ids((1, 2), seed=5)),
    ]
    keeps = [None, 2, None, 3, 1]
    requests = {i: Logits(decoder, b, k) for i, (b, k) in enumerate(zip(batches, keeps))}
    assert len(plan(requests)) == 5
    with extending(True):
        assert sorted(sorted(g) for g in plan(requests)) == [[0, 1, 4], [2, 3]]  # no mask apart from ones
        decoder.forward_memo.clear()
        replies = answer(requests)
    assert_each_request_got_its_own(decoder, batches, keeps, replies)
    longer = extended(batches[2], 9, decoder)
    assert longer.input_ids.shape == (1, 9) and bool(longer.attention_mask.all())
    assert torch.equal(longer.input_ids[:, :5], batches[2].input_ids)
    assert not bool((longer.input_ids[:, 5:] == decoder.capabilities.pad_token_id).any())


def test_rows_are_extended_only_after_the_causal_suite_shows_positions_read_nothing_later() -> None:
    """The report says when unpadded rows stack across lengths; a model whose positions
    read how many tokens follow them (no later id moves them: only cutting the row shows
    it) fails causal/future_tokens, and its rows stack at equal lengths only."""
    clean = audit("ref:tiny-decoder", ["causal", "padding"], profile="quick")
    assert clean.environment["batching"].endswith(
        "; unpadded rows of other lengths share forwards too, extended with later tokens (causal/future_tokens passed)"
    )
    reads_length = audit("mutant:causal_reads_row_length", ["causal", "padding"], profile="quick")
    assert reads_length.environment["batching"].endswith(
        "; unpadded rows stack at equal lengths only (causal/future_tokens fail: a position may read what follows it)"
    )
    check = next(c for c in reads_length.suite("causal").checks if c.name == "future_tokens")
    assert check.status == "fail" and "a position reads how many tokens follow it" in check.message
