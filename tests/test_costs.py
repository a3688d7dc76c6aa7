"""The cost profile and sharded (device-map) models."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from maskcheck import audit
from maskcheck.harness.adapters.specs import LoadOptions, load_adapter
from maskcheck.harness.audits.costs import kv_formula, profile, tensor_bytes
from maskcheck.harness.cli import main
from maskcheck.harness.engine.cases import GRADIENT_CASES
from maskcheck.reference_models.hf_tiny import tiny_model


def benchmarks_on_path() -> None:
    """Put benchmarks/ on ``sys.path``, once: its scripts import each other by name, as they
    do when run from that folder."""
    folder = str(Path(__file__).resolve().parent.parent / "benchmarks")
    if folder not in sys.path:
        sys.path.insert(0, folder)


def test_kv_bytes_per_token_match_the_formula_for_reference_and_hugging_face(tmp_path: Path) -> None:
    tiny_model("llama").save_pretrained(tmp_path, safe_serialization=True)
    for spec in ("ref:tiny-decoder-gqa", f"hf:{tmp_path}"):
        adapter = load_adapter(spec)
        result = profile(adapter, [16, 32], max_seconds=60, repeats=2, new_tokens=4)
        for costs in result.lengths:
            assert costs.kv_bytes_formula == kv_formula(adapter)
            assert costs.kv_bytes_per_token == pytest.approx(costs.kv_bytes_formula), (spec, costs)
            assert costs.peak_memory_bytes and costs.peak_memory_bytes > 0


def test_with_and_without_cache_feed_the_model_what_they_claim() -> None:
    """Structure, not timing (timings live in docs/performance.md and the benchmark): decode steps with
    the cache feed one token each; generation without it feeds the whole growing prefix."""
    adapter = load_adapter("ref:tiny-decoder")
    widths: list[int] = []
    handle = adapter.model.register_forward_pre_hook(
        lambda module, args, kwargs: widths.append(args[0].shape[1]), with_kwargs=True
    )
    try:
        profile(adapter, [32], max_seconds=60, repeats=2, new_tokens=4)
    finally:
        handle.remove()
    assert widths == [32, 32] + [1] * 4 + [32, 33]  # 2 prefills, 4 cached steps, no-cache tokens over 32 and 33


def test_time_budget_stops_at_the_longest_length_that_fits() -> None:
    result = profile(load_adapter("ref:tiny-decoder"), [16, 32, 64, 128], max_seconds=0.0, repeats=1, new_tokens=2)
    assert [c.length for c in result.lengths] == [16] and "exceed --max-seconds" in (result.stopped or "")


def test_cli_profile_writes_table_json_and_plot(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert (
        main(
            [
                "profile",
                "ref:tiny-decoder",
                "--lengths",
                "16,32",
                "--repeats",
                "2",
                "--new-tokens",
                "4",
                "--report",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "prefill p50/p95 ms" in out and "KV B/token" in out
    data = json.loads((tmp_path / "profile.json").read_text())
    assert [c["length"] for c in data["lengths"]] == [16, 32]
    assert (tmp_path / "profile.png").stat().st_size > 5000
    assert main(["profile", "ref:tiny-encoder"]) == 2
    assert "declares no KV cache" in capsys.readouterr().err


def test_tensor_bytes_counts_shared_storage_once() -> None:
    import torch

    x = torch.zeros(10)
    assert tensor_bytes({"a": x, "b": [x, x[:5]], "c": torch.zeros(3, dtype=torch.float16)}) == 40 + 6


def test_suites_keep_working_on_a_model_sharded_with_disk_offload(tmp_path: Path) -> None:
    tiny_model("llama", "sdpa").save_pretrained(tmp_path, safe_serialization=True)
    placement = {
        "model.embed_tokens": "cpu",
        "model.layers.0": "cpu",
        "model.layers.1": "disk",
        "model.norm": "cpu",
        "model.rotary_emb": "cpu",
        "lm_head": "cpu",
    }
    adapter = load_adapter(f"hf:{tmp_path}", LoadOptions(device_map=placement))
    assert adapter.model.hf_device_map["model.layers.1"] == "disk"
    result = audit(adapter, ["causal", "padding", "kv_cache"])
    assert [s.status for s in result.suites] == ["pass", "pass", "pass"]
    assert main(["audit", f"hf:{tmp_path}", "--device-map", "auto", "--suites", "causal", "-q"]) == 0


def test_lengths_leave_room_for_the_decoded_tokens() -> None:
    adapter = load_adapter("ref:tiny-decoder")  # 128 positions
    result = profile(adapter, None, max_seconds=60, repeats=1, new_tokens=16)
    assert [c.length for c in result.lengths] == [112]
    assert "beyond the model's maximum" in (profile(adapter, [128], repeats=1, new_tokens=4).stopped or "")


def test_the_overhead_benchmark_records_the_audit_it_times() -> None:
    """The benchmark's recorder wraps forward; the adapter must still see the model's own
    signature (it decides what the model takes from it), or the recorded audit is another
    audit. The calls are replayed as they were made: the training path's forwards with
    gradients in train mode, the gradient checks' with their backward, and the model is
    left as it was."""
    benchmarks_on_path()
    from audit_overhead import Recorder, replay

    from maskcheck.harness.adapters.specs import adapter_for

    model = tiny_model("gpt2")
    plain = adapter_for(model).capabilities
    grad = torch.autograd.grad
    recorder = Recorder(model)
    try:
        recorded = adapter_for(model).capabilities
        audit(adapter_for(model), ["causal"])
    finally:
        recorder.remove()
    assert recorded == plain and torch.autograd.grad is grad
    assert recorder.calls and all(call.module is model for call in recorder.calls)
    backward = [call for call in recorder.calls if call.backward]
    assert len(backward) == GRADIENT_CASES and all(call.grad and call.training for call in backward)
    assert any(call.grad and not call.backward for call in recorder.calls)  # the training path's forwards
    dropout = next(m.p for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert sum(replay(recorder.calls).values()) > 0
    assert not model.training and next(m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)) == dropout


def test_the_peer_comparison_audits_the_case_count_asked(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``--peer-only --examples N`` times the audit of N cases a check (the smallest audit's
    cost against the peer's run), and without ``--examples``, the profile's own count."""
    import subprocess

    benchmarks_on_path()
    import versus_peer

    commands: list[list[str]] = []

    def timed(command: list[str], threads: int) -> tuple[float, subprocess.CompletedProcess]:
        commands.append(command)
        return 1.0, subprocess.CompletedProcess(command, 0, "verdict: PASS in 0.5s (exit 0)\n", "")

    monkeypatch.setattr(versus_peer, "timed_process", timed)
    assert versus_peer.audit_process("ci", 1, examples=1)[1] == 0.5
    versus_peer.audit_process("ci", 1)
    assert commands[0][-2:] == ["--examples", "1"] and "--examples" not in commands[1]


def test_the_overhead_benchmark_breakdown_accounts_for_every_suite_and_restores_what_it_timed() -> None:
    benchmarks_on_path()
    from audit_overhead import breakdown

    from maskcheck.harness.audits import runner
    from maskcheck.reference_models import PRESETS, Transformer

    model = Transformer(PRESETS["tiny-decoder"]).eval()
    forward, run_check_keeping_cases = Transformer.forward, runner.run_check_keeping_cases
    split = breakdown(model, "dev")
    assert (Transformer.forward, runner.run_check_keeping_cases) == (forward, run_check_keeping_cases)
    # "(gate)": padding/batch_composition, run before the suites to decide whether cases share forwards
    assert set(split) == {
        "(gate)",
        "causal",
        "padding",
        "cross_attention",
        "loss_masking",
        "packing",
        "kv_cache",
        "serving",
        "norm_checkpoint",
    }
    assert all(seconds >= 0 for suite in split.values() for seconds in suite)
    assert split["kv_cache"][0] > 0 and split["cross_attention"][0] == 0  # a decoder: no cross-attention forwards


def test_the_overhead_benchmark_runs_the_model_in_the_dtype_asked() -> None:
    """``--dtype bfloat16`` (with ``--device cuda``, the prepared GPU run): the audit and the
    replayed forwards both run the low-precision model."""
    benchmarks_on_path()
    from audit_overhead import measure

    result = measure("tiny-reference", "dev", repeats=1, dtype="bfloat16")
    assert result["dtype"] == "bfloat16" and result["forwards"] > 0 and result["bare"] > 0
    assert {row["status"] for row in result["per_suite"].values()} <= {"pass", "warn", "not_applicable"}


@pytest.mark.call_paths  # every call path (conftest.py): the count tells them apart
def test_the_overhead_benchmark_counts_every_forward_the_audit_makes_by_suite_and_path() -> None:
    """``--count``: the forwards it counts are the ones the recorder records, the other call
    paths are told apart from the canonical one, and what it patched is restored."""
    benchmarks_on_path()
    from audit_overhead import Recorder, count

    from maskcheck.harness.audits import runner
    from maskcheck.reference_models import PRESETS, Transformer

    model = Transformer(PRESETS["tiny-decoder"]).eval()
    forward, run_one = Transformer.forward, runner._run_one
    counts, result = count(model, "dev")
    assert (Transformer.forward, runner._run_one) == (forward, run_one)
    recorder = Recorder(model)
    try:
        audit(model, profile="dev")
    finally:
        recorder.remove()
    assert sum(c["forwards"] for c in counts.values()) == len(recorder.calls)
    paths = {path for _, path in counts}
    assert "canonical" in paths and "bare_call" in paths and "training" in paths, paths
    assert counts[("causal", "canonical")]["tokens"] > 0
    assert {s.status for s in result.suites} <= {"pass", "warn", "not_applicable"}


def test_the_cases_needed_benchmark_finds_the_fewest_cases_that_catch_a_seeded_bug() -> None:
    """A bug the minimal case shows needs 1; one that needs a long row needs the drawn case too."""
    benchmarks_on_path()
    from cases_needed import needed

    from maskcheck.harness.audits import runner

    run_one = runner._run_one
    first, forwards, tokens, _ = needed("causal_sees_next_token", "dev", [1, 2])
    assert (first, runner._run_one) == (1, run_one) and forwards > 0 and tokens > 0
    assert needed("causal_leaks_past_length", "dev", [1, 2])[0] == 2


def test_the_scaling_benchmark_counts_each_context_and_estimates_each_size(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """``--scaling``: a longer context draws longer cases up to the profile's cap, and each
    model size gets the counted audit priced by its own fitted forward cost."""
    benchmarks_on_path()
    import audit_overhead

    monkeypatch.setattr(audit_overhead, "SCALING_CONTEXTS", (16, 1024))
    monkeypatch.setattr(audit_overhead, "GPT2_SIZES", (("narrow", 64, 1, 4),))
    monkeypatch.setattr(audit_overhead, "forward_cost", lambda model, repeats: ([], 0.01, 0.001))
    audit_overhead.scaling("dev")
    lines = capsys.readouterr().out.splitlines()
    short, long = (line for line in lines if line.strip().startswith("context"))

    def tokens(line: str) -> tuple[int, int]:  # "context N: F forwards T tokens (P projected ...)"
        counted = line.split("forwards")[1].split()
        return int(counted[0]), int(counted[2].lstrip("("))

    assert tokens(short)[0] < tokens(long)[0]
    assert all(projected <= tokens_ for tokens_, projected in map(tokens, (short, long)))
    estimate = next(line for line in lines if line.strip().startswith("narrow"))
    assert float(estimate.split()[-1]) > 0


def test_the_diagnosis_checks_draw_short_rows_while_the_other_checks_reach_the_cap() -> None:
    """`positions_from_mask` (a position shift) and `packing/settings` (which inputs isolate)
    measure what any length shows: no case of theirs holds a long row, while the checks
    beside them, given the same model and profile, still draw one past the short lengths."""
    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample

    from maskcheck.harness.adapters.hf import HFAdapter
    from maskcheck.harness.engine.registry import load_suite
    from maskcheck.harness.engine.suite import RunContext
    from maskcheck.harness.engine.tolerance import tolerance_for

    adapter = HFAdapter(tiny_model("gpt2"))  # 64 positions; takes position ids; several packing settings
    context = RunContext(tolerance=tolerance_for("cpu", "float32"), examples=10, profile="ci")
    search = settings(max_examples=300, database=None, suppress_health_check=list(HealthCheck))

    def long_case(strategy, row_lengths, short):  # type: ignore[no-untyped-def]
        """A drawn case whose longest row is past ``short``, or None when 300 draws hold none."""
        try:
            return find(strategy, lambda case: max(row_lengths(case)) > short, settings=search)
        except NoSuchExample:
            return None

    for suite, diagnosis, row_lengths, short in (
        ("padding", "positions_from_mask", lambda case: case.lengths, 12),
        ("packing", "settings", lambda case: case.segment_lengths, 6),
    ):
        checks = {c.name: c for c in load_suite(suite).checks(adapter, context)}
        assert long_case(checks[diagnosis].strategy, row_lengths, short) is None, diagnosis
        beside = next(c for name, c in checks.items() if name != diagnosis)
        assert long_case(beside.strategy, row_lengths, short) is not None, beside.name


def test_a_long_future_case_is_one_row_while_short_ones_have_up_to_three() -> None:
    """`future_tokens`' long row tests every position it has at once; more rows of the same
    length would test the same positions again at the price of their tokens (three times
    over, with the call paths that replay it). Short cases keep up to three rows."""
    from hypothesis import HealthCheck, find, settings
    from hypothesis.errors import NoSuchExample

    from maskcheck.suites.causal import future_cases

    search = settings(max_examples=300, database=None, suppress_health_check=list(HealthCheck))
    cases = future_cases(12, encoder_decoder=False, takes_mask=True, longest=250)
    assert find(cases, lambda case: case.length <= 12 and case.batch == 3, settings=search)
    assert find(cases, lambda case: case.length > 12, settings=search).batch == 1
    with pytest.raises(NoSuchExample):
        find(cases, lambda case: case.length > 12 and case.batch > 1, settings=search)
