"""Long-context probes: the shipped retrieval model, its masked controls, and a Hugging Face model with a local tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from maskcheck import audit
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.specs import LoadOptions, load_adapter
from maskcheck.harness.cli import main
from maskcheck.harness.engine.suite import ProbeError
from maskcheck.suites.probes import run_lost_in_the_middle, run_needle
from maskcheck.suites.probes.haystacks import Sample, Templates, TextHaystack, word_list
from maskcheck.suites.probes.scoring import greedy_answer, score
from maskcheck.suites.probes.summaries import (
    edge_vs_middle,
    effective_length,
    reach,
    wilson,
)

WINDOW, SINKS = 8, 4


@pytest.fixture(scope="module")
def shipped():  # type: ignore[no-untyped-def]
    return load_adapter("ref:kv-retrieval")


def test_shipped_model_retrieves_at_every_depth_of_its_trained_lengths(shipped) -> None:  # type: ignore[no-untyped-def]
    assert shipped.capabilities.trained_length == 64
    result = run_needle(shipped, lengths=[16, 32, 64], samples=4)
    assert min(result.summary["min_accuracy_over_depths"].values()) >= 0.95, result.summary
    assert result.summary["effective_length"] == 64 and not result.summary["flags"]
    assert result.summary["mean_gain"] > 3.0  # the needle, not a guess, gives the answer


def test_sliding_window_control_is_short_sighted(shipped) -> None:  # type: ignore[no-untyped-def]
    full = run_needle(shipped, lengths=[32, 64], samples=3).summary["reach"]
    window = run_needle(shipped.relayout(sliding_window=WINDOW), lengths=[32, 64], samples=3).summary["reach"]
    layers = shipped.capabilities.n_layers
    assert window is not None and window <= layers * (WINDOW - 1) + 1
    assert full is not None and full >= 4 * window, (full, window)


def test_sink_and_window_control_is_lost_in_the_middle(shipped) -> None:  # type: ignore[no-untyped-def]
    control = run_lost_in_the_middle(shipped.relayout(sliding_window=WINDOW, attention_sinks=SINKS), samples=6)
    assert control.summary["edge_vs_middle"] >= 0.8, control.summary
    full = run_lost_in_the_middle(shipped, samples=6)
    assert min(full.summary["accuracy_by_slot"]) >= 0.95 and full.summary["edge_vs_middle"] <= 0.05
    assert full.summary["closed_book_accuracy"] <= 0.2  # without the item the model can only guess


def test_lengths_beyond_training_are_flagged(shipped) -> None:  # type: ignore[no-untyped-def]
    result = run_needle(shipped, lengths=[64, 128], depths=[0.5], samples=2)
    assert result.summary["flags"] == {"128": "beyond the trained length 64"}


def test_cli_probe_writes_grid_and_picture(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert (
        main(
            [
                "probe",
                "needle",
                "ref:kv-retrieval",
                "--lengths",
                "16,32",
                "--depths",
                "3",
                "--samples",
                "2",
                "--report",
                str(tmp_path),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "effective length 32" in out
    grid = json.loads((tmp_path / "needle.json").read_text())
    assert set(grid["grid"]) == {f"{length}/{depth:g}" for length in (16, 32) for depth in (0, 0.5, 1)}
    assert (tmp_path / "needle.png").stat().st_size > 5000
    assert (
        main(
            [
                "probe",
                "lost-in-the-middle",
                "ref:kv-retrieval",
                "--samples",
                "2",
                "--report",
                str(tmp_path),
                "--override",
                "sliding_window=8",
                "--override",
                "attention_sinks=4",
            ]
        )
        == 0
    )
    assert (tmp_path / "lost-in-the-middle.png").stat().st_size > 5000
    assert "edge vs middle 1.00" in capsys.readouterr().out


def test_probes_as_audit_entries(tmp_path: Path) -> None:
    result = audit("ref:kv-retrieval", ["causal"], probes=["needle", "lost-in-the-middle"], report_dir=tmp_path)
    names = [p["name"] for p in result.probes]
    assert names == ["needle", "lost-in-the-middle"] and all(Path(p["picture"]).is_file() for p in result.probes)
    untrained = audit("ref:tiny-decoder", ["causal"], probes=["needle"])
    assert "no tokenizer" in untrained.probes[0]["summary"]["error"]


def test_a_model_without_tokenizer_or_retrieval_vocab_is_a_clear_error(capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProbeError, match="no tokenizer"):
        run_needle(load_adapter("ref:tiny-decoder"))
    assert main(["probe", "needle", "ref:tiny-decoder"]) == 2
    assert "no tokenizer" in capsys.readouterr().err


def test_summaries() -> None:
    low, high = wilson(0, 10)
    assert low == 0.0 and 0.2 < high < 0.35
    low, high = wilson(10, 10)
    assert 0.65 < low < 0.75 and high == 1.0
    assert effective_length({16: 1.0, 32: 0.95, 64: 0.5, 128: 0.95}, 0.9) == 32
    assert reach([(1, True), (5, True), (9, False), (13, True)], 0.9, bucket=4) == 7
    assert edge_vs_middle([1.0, 0.2, 0.0, 0.9]) == pytest.approx(0.9)


# -- a Hugging Face model with a tokenizer built here --------------------------------------------


@pytest.fixture(scope="module")
def hf_with_tokenizer():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from maskcheck.reference_models.hf_tiny import tiny_config

    words = word_list()
    corpus = [
        " ".join(words[i : i + 12]).capitalize() + ". The special magic number for a-b is 12345."
        for i in range(0, len(words), 12)
    ]
    corpus += ["What is the special magic number? 0123456789 -"]
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        corpus, trainers.BpeTrainer(vocab_size=160, special_tokens=["<pad>", "<s>", "</s>", "<unk>"])
    )
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>"
    )
    config = tiny_config("llama")
    config.vocab_size = len(wrapped)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    return HFAdapter(model, "hf:tiny-llama-with-tokenizer", tokenizer=wrapped)


def test_needle_span_is_located_exactly_by_offsets(hf_with_tokenizer) -> None:  # type: ignore[no-untyped-def]
    haystack = TextHaystack(hf_with_tokenizer.capabilities.tokenizer)
    for length, depth in [(60, 0.0), (64, 0.5), (96, 1.0), (77, 0.3)]:
        sample = haystack.needle(length, depth, seed=length)
        assert len(sample.prompt) == length  # fitted exactly, in tokens
        start, end = sample.needle
        encoded = haystack.tokenizer(sample.meta["text"], return_offsets_mapping=True)
        offsets = encoded["offset_mapping"]
        assert encoded["input_ids"] == sample.prompt.tolist()
        chars = sample.meta["needle_chars"]
        assert (offsets[start][0], offsets[end - 1][1]) == chars
        assert sample.meta["text"][chars[0] : chars[1]] == sample.meta["needle_text"]


def test_probes_run_end_to_end_on_a_hugging_face_model(hf_with_tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    needle = run_needle(hf_with_tokenizer, lengths=[60, 64], depths=[0.0, 0.5, 1.0], samples=2)
    assert set(needle.grid) == {f"{length}/{depth:g}" for length in (60, 64) for depth in (0, 0.5, 1)}
    assert needle.summary["flags"] == {}  # within max_position_embeddings
    lost = run_lost_in_the_middle(hf_with_tokenizer, length=96, items=4, samples=2)
    assert len(lost.summary["accuracy_by_slot"]) == 4
    needle.write(tmp_path, lambda result, path: path.write_bytes(b"png") or path)
    assert json.loads((tmp_path / "needle.json").read_text())["summary"]["lengths"] == [60, 64]


def test_teacher_forced_is_greedy_agrees_with_real_greedy_generation(hf_with_tokenizer) -> None:  # type: ignore[no-untyped-def]
    haystack = TextHaystack(hf_with_tokenizer.capabilities.tokenizer)
    agreements = []
    for seed in range(4):
        sample = haystack.needle(60, 0.5, seed)
        generated = greedy_answer(hf_with_tokenizer, sample.prompt, len(sample.answer))
        with torch.no_grad():
            reference = hf_with_tokenizer.model.generate(
                sample.prompt[None], max_new_tokens=len(sample.answer), do_sample=False
            )[0, len(sample.prompt) :]
        assert generated.tolist() == reference.tolist()  # the adapter's cache decodes as generate() does
        # The model's own continuation is greedy by construction; a changed last token is not.
        own = Sample(sample.prompt, sample.closed_book, generated, sample.distractors, sample.needle)
        changed = generated.clone()
        changed[-1] = (changed[-1] + 1) % len(haystack.tokenizer)
        other = Sample(sample.prompt, sample.closed_book, changed, sample.distractors, sample.needle)
        agreements += [score(hf_with_tokenizer, own).is_greedy, not score(hf_with_tokenizer, other).is_greedy]
        # And for the real value: is_greedy exactly when generation reproduces it.
        assert score(hf_with_tokenizer, sample).is_greedy == (
            greedy_answer(hf_with_tokenizer, sample.prompt, len(sample.answer)).tolist() == sample.answer.tolist()
        )
    assert all(agreements)


def test_hf_directory_probe_uses_the_saved_tokenizer(hf_with_tokenizer, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    hf_with_tokenizer.model.save_pretrained(tmp_path, safe_serialization=True)
    hf_with_tokenizer.capabilities.tokenizer.save_pretrained(tmp_path)
    adapter = load_adapter(f"hf:{tmp_path}", LoadOptions())
    assert adapter.capabilities.tokenizer is not None
    assert run_needle(adapter, lengths=[60], depths=[0.5], samples=1).summary["lengths"] == [60]


def test_templates_and_generation_with_string_match(hf_with_tokenizer) -> None:  # type: ignore[no-untyped-def]
    templates = {"needle": "Remember: the code of {key} is {value}.", "question": "The code of {key} is"}
    result = run_needle(hf_with_tokenizer, lengths=[64], depths=[0.5], samples=2, templates=templates, generate=True)
    assert all("generated_match" in row for row in result.samples)
    # Random weights: a string match implies the exact tokens were generated, which teacher forcing calls greedy.
    assert all(row["is_greedy"] or not row["generated_match"] for row in result.samples)
    assert 0.0 <= result.summary["generated_accuracy"] <= 1.0
    haystack = TextHaystack(hf_with_tokenizer.capabilities.tokenizer, templates=Templates(**templates))
    assert "Remember: the code of" in haystack.needle(64, 0.5, 0).meta["needle_text"]


def test_shipped_model_generation_matches_teacher_forcing(shipped) -> None:  # type: ignore[no-untyped-def]
    result = run_needle(shipped, lengths=[32], depths=[0.0, 1.0], samples=2, generate=True)
    assert result.summary["generated_accuracy"] == result.summary["accuracy"] == 1.0


def test_cli_audit_runs_probes_after_the_suites(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert (
        main(["audit", "ref:kv-retrieval", "--suites", "causal", "--probes", "needle", "--report", str(tmp_path), "-q"])
        == 0
    )
    assert "probe needle: accuracy" in capsys.readouterr().out
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["probes"][0]["name"] == "needle" and Path(report["probes"][0]["grid"]).is_file()
    assert "## Probe: needle" in (tmp_path / "report.md").read_text()
