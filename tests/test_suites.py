"""The mask suites: pass on every clean model, fail on every seeded bug for the right reason."""

from __future__ import annotations

import pytest
from catalogue import mutant_params

from maskcheck import audit
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.engine.registry import suite_names
from maskcheck.reference_models import PRESETS
from maskcheck.reference_models.chunked_hf import CHUNK
from maskcheck.reference_models.hf_tiny import TINY_CONFIGS, tiny_model
from maskcheck.reference_models.mutants import MUTANTS
from maskcheck.reference_models.reference_bugs import CHUNKED, LONG_FROM

#: the fewest tokens that show a seeded bug, where more than four: its mask is wrong only past
#: position 39, or only where a row (a packed row) is longer than a chunk
MINIMAL_TOKENS = {
    "causal_leaks_past_length": LONG_FROM + 2,
    "hf_llama4_chunks_from_column_zero": CHUNK + 1,
    "hf_llama4_cache_reads_previous_chunk": CHUNK + 1,
    "packing_chunks_across_sequences": CHUNKED.attention_chunk + 1,
}
#: the fewest rows that show a seeded bug, where more than one: a cache's padding needs a
#: second, longer prompt to be left-padded beside
MINIMAL_ROWS = {"onnx_cached_export_forgets_padding": 2}
MASK_SUITES = suite_names(lambda suite: suite.kind == "mask")  # causal, padding, cross_attention, loss_masking
NEVER_FAILING = {"pass", "warn", "not_applicable"}


def failures(result) -> list[str]:  # type: ignore[no-untyped-def]
    return [
        f"{s.name}/{c.name}: {c.status}: {c.message}"
        for s in result.suites
        for c in s.checks
        if c.status not in NEVER_FAILING
    ]


@pytest.mark.call_paths
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_clean_reference_models_pass_every_mask_suite(preset: str) -> None:
    result = audit(f"ref:{preset}", MASK_SUITES)
    assert not failures(result), failures(result)
    assert result.suite("causal").status == "pass"
    # Reference models derive positions from the mask, so nothing should even warn.
    assert {s.status for s in result.suites} <= {"pass", "not_applicable"}


@pytest.mark.call_paths
@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_clean_hugging_face_models_pass_every_mask_suite(name: str, implementation: str) -> None:
    result = audit(HFAdapter(tiny_model(name, implementation)), MASK_SUITES)
    assert not failures(result), failures(result)


def test_expected_warnings_on_hugging_face_models() -> None:
    """GPT-2 does not derive positions from the mask; BART takes no position ids at all."""
    gpt2 = audit(HFAdapter(tiny_model("gpt2")), ["padding"]).suite("padding")
    check = next(c for c in gpt2.checks if c.name == "positions_from_mask")
    assert check.status == "warn" and "position_ids" in check.message
    bart = audit(HFAdapter(tiny_model("bart")), ["padding"]).suite("padding")
    assert any(c.status == "warn" and "left padding shifts" in c.message for c in bart.checks)


#: checks whose failing case is not drawn small: the pattern checks measure at a fixed length
#: (the declared pattern's, or a layer's real window); a layout's behaviour is scored on one probe;
#: a pooled output's padding sides are measured on two fixed rows (suites/pooling.py)
FIXED_SIZE_CHECKS = ("declared_pattern", "layer_windows", "behaviour", "pooling")


@pytest.mark.call_paths
@pytest.mark.parametrize("name", mutant_params())
def test_every_seeded_bug_fails_its_suite_for_the_right_reason_shrunk_to_a_minimal_case(name: str) -> None:
    """Each seeded bug fails the check it names, by a measured difference over its threshold,
    and a drawn failure shrinks to one row of at most four tokens (one audit for both)."""
    mutant = MUTANTS[name]
    result = audit(f"mutant:{name}", [mutant.suite])
    suite = result.suite(mutant.suite)
    assert suite.status == "fail", f"{name} was not caught: {[(c.name, c.status, c.message) for c in suite.checks]}"
    check = next(c for c in suite.checks if c.name == mutant.check)
    assert check.status == "fail", f"{name}: expected {mutant.check} to fail, got {check.status}: {check.message}"
    assert check.max_diff is not None and check.threshold is not None
    # A leak is a difference above threshold; a missing influence (a causal encoder, a prefix
    # read causally) is its absence.
    absent = ("no output is influenced by any later input", "the prefix is read causally", "are NaN/inf")
    assert check.max_diff > check.threshold or any(reason in check.message for reason in absent)
    assert result.exit_code == 1
    if mutant.check not in FIXED_SIZE_CHECKS:
        assert_minimal(name, check.case)


def assert_minimal(name: str, case: dict | None) -> None:
    assert case is not None
    if "segment_lengths" in case:  # packing: two sequences of at most 2 tokens in one row
        lengths = case["segment_lengths"]
        assert len(lengths) == 2 and case["padding"] == 0, case
        assert sum(lengths) <= MINIMAL_TOKENS[name] if name in MINIMAL_TOKENS else max(lengths) <= 2, case
        return
    if "drafted" in case:  # serving rollback: one row, one draft token rolled back, one new token
        assert (
            len(case["prompt_lengths"]) == 1 and max(case["prompt_lengths"]) + case["drafted"] + case["new_tokens"] <= 4
        )
        return
    if "order_seed" in case:  # serving row operations: two rows (the fewest to rearrange), one token each side
        assert len(case["prompt_lengths"]) == 2 and max(case["prompt_lengths"]) + case["before"] + case["after"] <= 4
        return
    if "first_lengths" in case:  # serving reuse: one row for each request
        assert len(case["first_lengths"]) == 1 and case["second_lengths"][0] + case["steps"] <= 4, case
        return
    if "new_tokens" in case:  # greedy generation: two rows (the fewest that need padding) and one decoding step
        assert len(case["prompt_lengths"]) == 2 and max(case["prompt_lengths"]) + case["new_tokens"] <= 4, case
        return
    if "others_a" in case:  # batch composition: a short row beside one other row, or none
        assert len(case["others_a"]) + len(case["others_b"]) == 1 and case["length"] <= 4, case
        return
    if "prompt_lengths" in case:  # kv_cache: a prompt and the chunks fed after it
        rows, tokens = len(case["prompt_lengths"]), max(case["prompt_lengths"]) + sum(case.get("chunks", ()))
    else:
        rows = case.get("batch", len(case.get("lengths", case.get("source_lengths", ()))))
        tokens = case.get("length") or max(case.get("lengths", case.get("source_lengths", (0,)))) + case.get("extra", 0)
    assert rows <= MINIMAL_ROWS.get(name, 1), case
    assert tokens <= MINIMAL_TOKENS.get(name, 4), case


def test_failure_message_prints_measured_floor_and_threshold() -> None:
    check = audit("mutant:padding_mask_ignored", ["padding"]).suite("padding").checks[0]
    assert "max |d log p|" in check.message and "threshold" in check.message and "noise floor" in check.message
    assert check.positions, "the leaking positions are named"


def test_declared_sliding_window_is_enforced() -> None:
    check = next(
        c
        for c in audit("mutant:causal_window_ignored", ["causal"]).suite("causal").checks
        if c.name == "declared_pattern"
    )
    assert "sliding window W=3 over L=2 layers (reach 4)" in check.message
    # [output, input] pairs: only inputs further back than the reach (4) are leaks.
    assert check.positions_label == "output, input"
    assert check.positions and all(output >= 5 and output - input > 4 for output, input in check.positions)


def test_one_failing_suite_does_not_stop_the_others() -> None:
    from maskcheck.harness.adapters.base import Capabilities
    from maskcheck.harness.adapters.module import ModuleAdapter

    def raises(ids, mask):  # type: ignore[no-untyped-def]
        raise RuntimeError("kaboom")

    result = audit(
        ModuleAdapter(raises, Capabilities(family="decoder", vocab_size=8), mask_convention="keep"), MASK_SUITES
    )
    assert [s.status for s in result.suites] == ["error", "error", "not_applicable", "not_applicable"]
    assert "kaboom" in result.suite("causal").checks[0].message
    assert result.exit_code == 1


def test_nan_at_a_compared_position_fails() -> None:
    import torch

    from maskcheck.harness.adapters.base import Capabilities
    from maskcheck.harness.adapters.module import ModuleAdapter

    def nan_when_padded(ids, mask):  # type: ignore[no-untyped-def]
        # NaN everywhere once any row of the batch is padded: the repeat floor is NaN too
        logits = torch.randn(*ids.shape, 8, generator=torch.Generator().manual_seed(0))
        return logits + (0.0 if mask is None or bool(mask.all()) else float("nan"))

    result = audit(
        ModuleAdapter(
            nan_when_padded,
            Capabilities(family="encoder", vocab_size=8, attention="bidirectional"),
            mask_convention="keep",
        ),
        ["padding"],
    )
    checks = {c.name: c for c in result.suite("padding").checks}
    # Every check that runs a padded row sees NaN there: none may pass, whatever its floor
    # (a NaN repeat floor once made the threshold inf and padded_vs_unpadded passed).
    for name in ("pad_ids", "padded_vs_unpadded", "extra_padding"):
        assert checks[name].status == "fail" and "NaN/inf" in checks[name].message, (name, checks[name])


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(20))
def test_no_false_positives_across_seeds(seed: int) -> None:
    suites = [*MASK_SUITES, "packing", "kv_cache"]
    for preset in (
        "tiny-decoder-gqa",
        "tiny-decoder-mqa-alibi",
        "tiny-decoder-sliding",
        "tiny-encoder",
        "tiny-encoder-decoder-rotary",
    ):
        result = audit(f"ref:{preset}", suites, seed=seed)
        assert not failures(result), (preset, failures(result))
    for name in ("llama", "mistral", "gpt2", "bert", "t5"):
        result = audit(HFAdapter(tiny_model(name, "sdpa")), suites, seed=seed)
        assert not failures(result), (name, failures(result))


def leak_cells(spec: str, suite_name: str) -> tuple[set[tuple[int, int]], int]:
    from maskcheck.harness.adapters.specs import load_adapter
    from maskcheck.harness.engine.registry import load_suite
    from maskcheck.harness.engine.suite import RunContext
    from maskcheck.harness.engine.tolerance import tolerance_for

    adapter = load_adapter(spec)
    context = RunContext(tolerance=tolerance_for("cpu", "float32"))
    influence, expected = load_suite(suite_name).effective_mask(adapter, context, length=8)
    return {tuple(c) for c in (influence.measured & ~expected).nonzero().tolist()}, expected.shape[0]


def test_effective_mask_marks_exactly_the_cells_each_seeded_bug_leaks() -> None:
    # Two layers that each read one token ahead: output i reads inputs i+1 and i+2.
    cells, n = leak_cells("mutant:causal_sees_next_token", "causal")
    assert cells == {(i, j) for i in range(n) for j in (i + 1, i + 2) if j < n}
    # The last layer is bidirectional: every output reads every later input.
    cells, n = leak_cells("mutant:causal_last_layer_bidirectional", "causal")
    assert cells == {(i, j) for i in range(n) for j in range(i + 1, n)}
    # Window 3 over 2 layers reaches back 4 positions; without the window every older input leaks.
    cells, n = leak_cells("mutant:causal_window_ignored", "causal")
    assert cells == {(i, j) for i in range(n) for j in range(n) if i - j > 4}
    # Left padding of 2 slots: every real output (2..7) reads both padded inputs (0, 1).
    assert leak_cells("mutant:padding_mask_ignored", "padding")[0] == {(i, j) for i in range(2, 8) for j in (0, 1)}
    # The decoder reads the two right-padded source slots (6, 7) from every output.
    cells, _ = leak_cells("mutant:cross_attention_unmasked", "cross_attention")
    assert cells == {(i, j) for i in range(4) for j in (6, 7)}
    assert leak_cells("ref:tiny-encoder-decoder", "cross_attention")[0] == set()
    assert (
        leak_cells("ref:tiny-decoder", "causal")[0] == set() and leak_cells("ref:tiny-encoder", "padding")[0] == set()
    )


def test_report_directory_gets_the_picture_of_every_mask_suite_that_ran(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from maskcheck.harness.cli import main

    assert (
        main(
            [
                "audit",
                "mutant:padding_mask_ignored",
                "--suites",
                "padding,causal,kv_cache",
                "-q",
                "--report",
                str(tmp_path),
            ]
        )
        == 1
    )
    assert (tmp_path / "padding-effective-mask.png").stat().st_size > 1000
    # A passing mask suite gets its picture too; a suite with no mask picture (kv_cache) none.
    assert (tmp_path / "causal-effective-mask.png").stat().st_size > 1000
    assert not (tmp_path / "kv_cache-effective-mask.png").exists()
    import json

    report = json.loads((tmp_path / "report.json").read_text())
    assert report["suites"][0]["picture"].endswith("padding-effective-mask.png")


def test_pictures_of_a_nan_model_and_of_a_batch_dependent_failure_say_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """An all-NaN model gets a picture that says NaN (not a blank panel); a failing suite whose
    leak does not show in one unpadded row gets a caption saying so (not a clean matrix beside a FAIL)."""
    import matplotlib.pyplot as plt
    import torch

    from maskcheck.harness.engine.influence import Influence
    from maskcheck.harness.report.picture import draw_effective_mask

    captions = []
    original = plt.Figure.suptitle
    plt.Figure.suptitle = lambda self, text, **kw: captions.append(text) or original(self, text, **kw)  # type: ignore[method-assign]
    try:
        expected = torch.ones(3, 3, dtype=torch.bool).tril()
        clean = Influence(
            torch.zeros(3, 3, dtype=torch.float64),
            0.0,
            1e-6,
            torch.ones(3, dtype=torch.bool),
            torch.ones(3, dtype=torch.bool),
        )
        nan = Influence(
            torch.full((3, 3), float("nan"), dtype=torch.float64),
            float("nan"),
            float("inf"),
            torch.ones(3, dtype=torch.bool),
            torch.ones(3, dtype=torch.bool),
        )
        draw_effective_mask(nan, expected, tmp_path / "nan.png", "nan model", failed=True)
        draw_effective_mask(clean, expected, tmp_path / "batch.png", "batch-dependent", failed=True)
        draw_effective_mask(clean, expected, tmp_path / "pass.png", "passing")
    finally:
        plt.Figure.suptitle = original  # type: ignore[method-assign]
    assert "NaN or inf" in captions[0] and "depends on the batch" in captions[1] and captions[2] == "passing"
    assert all((tmp_path / name).stat().st_size > 1000 for name in ("nan.png", "batch.png", "pass.png"))


def test_the_picture_labels_padded_rows_and_columns(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A left-padded row of 4 (2 pads): rows 0-1 and columns 0-1 say "pad"; a real column does not."""
    import matplotlib.pyplot as plt
    import torch

    from maskcheck.harness.engine.influence import Influence
    from maskcheck.harness.report.picture import draw_effective_mask

    labels: dict[str, list[str]] = {"x": [], "y": []}
    originals = plt.Axes.set_xticklabels, plt.Axes.set_yticklabels
    plt.Axes.set_xticklabels = lambda self, ticks, **kw: labels["x"].extend(ticks) or originals[0](self, ticks, **kw)  # type: ignore[method-assign]
    plt.Axes.set_yticklabels = lambda self, ticks, **kw: labels["y"].extend(ticks) or originals[1](self, ticks, **kw)  # type: ignore[method-assign]
    try:
        real = torch.tensor([False, False, True, True])
        expected = torch.ones(4, 4, dtype=torch.bool).tril() & real[None, :] & real[:, None]
        influence = Influence(torch.zeros(4, 4, dtype=torch.float64), 0.0, 1e-6, real, torch.ones(4, dtype=torch.bool))
        draw_effective_mask(influence, expected, tmp_path / "padded.png", "left-padded row")
    finally:
        plt.Axes.set_xticklabels, plt.Axes.set_yticklabels = originals  # type: ignore[method-assign]
    assert labels["y"][:4] == ["0 pad", "1 pad", "2", "3"]
    assert labels["x"][:4] == ["0\npad", "1\npad", "2", "3"]


@pytest.mark.parametrize(
    ("decay", "words"),
    [(0.0, "nothing farther moves at all: an undeclared window"), (0.05, "below the threshold but not zero")],
)
def test_influence_that_stops_short_is_called_a_window_only_when_nothing_farther_moves(
    decay: float, words: str
) -> None:
    """A recurrence ``state = decay * state + embedding``: with decay 0 each output reads its own
    token only (a window of one); with 0.05 older tokens still move it, by less than the threshold."""
    import torch

    from maskcheck.harness.adapters.base import Capabilities
    from maskcheck.harness.adapters.module import ModuleAdapter

    table = torch.randn(8, 8, generator=torch.Generator().manual_seed(0))

    def forward(ids, mask):  # type: ignore[no-untyped-def]
        embedded = table[ids]  # [B, T, V]
        out, state = torch.zeros_like(embedded), torch.zeros_like(embedded[:, 0])
        for t in range(ids.shape[1]):
            state = decay * state + embedded[:, t]
            out[:, t] = state
        return out

    checks = {
        c.name: c
        for c in audit(
            ModuleAdapter(forward, Capabilities(family="decoder", vocab_size=8), mask_convention="keep"), ["causal"]
        )
        .suite("causal")
        .checks
    }
    assert checks["future_tokens"].status == "pass"
    assert checks["declared_pattern"].status == "warn" and words in checks["declared_pattern"].message
