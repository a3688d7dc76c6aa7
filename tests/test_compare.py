"""maskcheck compare: clean pairs agree on every check compared, seeded divergences are found
where they were put (the first differing module), and the weights loader accounts for every tensor."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from maskcheck.harness.cli import main as cli_main
from maskcheck.harness.compare.layers import Record, first_difference
from maskcheck.harness.compare.reproduction import replay_models, replay_parting
from maskcheck.harness.compare.run import CompareError, compare
from maskcheck.harness.compare.weights import WeightsMismatch, load_weights
from maskcheck.harness.report.reproduction import BundleError
from maskcheck.reference_models import mutants
from maskcheck.reference_models.hf_tiny import tiny_model
from maskcheck.reference_models.ports import ported, saved_and_loaded

PORTS = "maskcheck.reference_models.ports"
SUITES = ["causal", "padding", "packing", "kv_cache", "serving"]


def checks(result):
    return {(s.name, c.name): c for s in result.suites for c in s.checks}


def assert_agree(result):
    compared = [c for c in checks(result).values() if c.status in ("pass", "fail", "error")]
    assert compared, "no check compared anything"
    failing = [f"{c.name}: {c.status} {c.message}" for c in compared if c.status != "pass"]
    assert not failing, failing
    assert result.exit_code == 0


def test_eager_and_sdpa_of_one_llama_agree():
    result = compare(tiny_model("llama", "eager"), tiny_model("llama", "sdpa"), SUITES, profile="dev")
    assert_agree(result)
    found = checks(result)
    assert found[("kv_cache", "incremental")].status == "pass"
    assert found[("serving", "beam_reorder")].status == "pass"
    # the backwards are compared too: where each gradient reaches
    assert found[("causal", "future_gradients")].status == "pass"
    assert "call(s) compared" in found[("causal", "future_gradients")].message


def test_eager_and_sdpa_of_one_sliding_window_mistral_agree():
    result = compare(
        tiny_model("mistral", "eager"), tiny_model("mistral", "sdpa"), ["causal", "serving"], profile="dev"
    )
    assert_agree(result)
    assert checks(result)[("serving", "window_eviction")].status == "pass"


def test_a_model_saved_and_loaded_again_agrees_with_itself(tmp_path):
    model = tiny_model("llama", "eager")
    assert_agree(
        compare(model, saved_and_loaded(model, str(tmp_path / "saved")), ["causal", "kv_cache"], profile="dev")
    )


@pytest.mark.parametrize(
    ("divergence", "module", "length"),
    [
        (
            "gqa_repeat_not_interleave",
            "model.layers.0.self_attn.o_proj",
            2,
        ),  # the first output after the attention core
        ("rms_norm_eps_outside_sqrt", "model.layers.0.input_layernorm", 2),
        ("rotary_wrong_half", "model.layers.0.self_attn.o_proj", 2),  # q and k agree before rotary
        (
            "sliding_window_dropped",
            "model.layers.0.self_attn.o_proj",
            5,
        ),  # window 4: the fifth position reaches past it
    ],
)
def test_a_seeded_divergence_is_found_at_its_module(divergence, module, length):
    a, b = ported(divergence)
    result = compare(a, b, ["causal", "kv_cache"], profile="dev")
    assert result.exit_code == 1
    failed = checks(result)[("causal", "future_tokens")]
    assert failed.status == "fail"
    assert failed.first_difference is not None and failed.first_difference.a_name == module, failed.message
    assert failed.case is not None and failed.case["length"] == length  # shrunk to the smallest case
    assert module in failed.message
    if divergence == "sliding_window_dropped":
        assert {t for _, t in failed.first_difference.positions} == {4}
    if divergence == "rotary_wrong_half":  # position 0 is not rotated: the port parts from position 1
        assert {t for _, t in failed.first_difference.positions} == {1}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_softmax_in_the_input_dtype_is_rounding_not_a_divergence(dtype):
    """torch's softmax of low-precision scores is bit for bit the float32 softmax cast back
    (scripts/softmax_input_dtype.py), so the port that skips eager's float32 agrees."""
    scores = (torch.randn(8, 64, generator=torch.Generator().manual_seed(0)) * 4).to(dtype)
    assert torch.equal(torch.softmax(scores, -1), torch.softmax(scores, -1, dtype=torch.float32).to(dtype))
    a, b = ported("softmax_in_input_dtype")
    assert_agree(compare(a.to(dtype), b.to(dtype), ["causal", "kv_cache"], profile="dev"))


def test_the_softmax_measurement_script_reports_each_row_length(capsys):
    import runpy

    script = Path(__file__).resolve().parent.parent / "scripts" / "softmax_input_dtype.py"
    main = runpy.run_path(str(script))["main"]
    assert main(["--dtype", "bfloat16"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()[2:]]
    assert [row[0] for row in rows] == ["8", "64", "512", "4096"]
    assert all(" ".join(row[1:4]).startswith("bit for bit") for row in rows)
    assert all(float(row[-1]) > float(row[-3]) for row in rows)  # by hand is farther off than the cast


@pytest.mark.call_paths
def test_the_plain_decoder_and_its_port_with_renamed_modules_agree_once_given_its_weights():
    """The clean pair of renamed modules: GPT-2's names and attention written out by hand."""
    from maskcheck.reference_models.plain import plain_decoder
    from maskcheck.reference_models.plain_port import port_key, ported_plain_decoder

    a, b = plain_decoder(), ported_plain_decoder()
    unloaded = checks(compare(a, b, ["causal"], profile="dev"))[("causal", "future_tokens")]
    assert unloaded.status == "fail"  # the pair can part: its own random weights
    assert unloaded.first_difference is not None and unloaded.first_difference.b_name == "wte"  # matched by order
    result = compare(a, b, profile="dev", weights=port_key)
    assert_agree(result)
    assert result.weights["read"] == result.weights["loaded"] == len(a.state_dict())
    found = checks(result)
    for compared in [("padding", "padded_vs_unpadded"), ("kv_cache", "incremental"), ("serving", "beam_reorder")]:
        assert found[compared].status == "pass", found[compared].message
    assert "agrees on the bare_call, mask_of_ones, training path(s) too" in found[("kv_cache", "incremental")].message


@pytest.mark.call_paths
def test_a_port_whose_training_forward_ignores_padding_parts_only_on_the_training_path(tmp_path):
    """The call paths users run, compared: eval mode agrees, the training forward does not."""
    from maskcheck.reference_models.plain import PlainDecoder, plain_decoder
    from maskcheck.reference_models.plain_port import (
        port_key,
        ported_plain_decoder,
        ported_plain_decoder_training_ignores_padding,
    )

    keys = {name: port_key(name) for name in PlainDecoder().state_dict()}
    a, b = plain_decoder(), ported_plain_decoder_training_ignores_padding()
    found = checks(compare(a, b, ["padding"], profile="dev", weights=keys, bundle_dir=tmp_path))
    parted = found[("padding", "batch_composition")]
    assert parted.status == "fail" and parted.message.startswith("on the training path: B parts from A"), parted
    # positions are counted over real tokens: a forward that forgets the mask parts at the position table
    assert parted.first_difference is not None and parted.first_difference.b_name == "wpe"
    assert parted.reproduction is not None
    assert json.loads((Path(parted.reproduction) / "parting.json").read_text())["path"] == "training"
    assert replay_parting(parted.reproduction, a=a, b=b).status == "fail"
    assert replay_parting(parted.reproduction, a=a, b=ported_plain_decoder()).status == "pass"


def test_a_port_whose_backward_ignores_the_mask_parts_only_in_the_backward(tmp_path):
    """Every forward agrees (cached or not); the gradient reaches future tokens, found going
    backward at the last layer's attention input projection."""
    from maskcheck.reference_models.plain import PlainDecoder, plain_decoder
    from maskcheck.reference_models.plain_port import (
        port_key,
        ported_plain_decoder,
        ported_plain_decoder_backward_ignores_mask,
    )

    keys = {name: port_key(name) for name in PlainDecoder().state_dict()}
    a, b = plain_decoder(), ported_plain_decoder_backward_ignores_mask()
    found = checks(compare(a, b, ["causal", "kv_cache"], profile="dev", weights=keys, bundle_dir=tmp_path))
    for forward in [("causal", "future_tokens"), ("kv_cache", "incremental")]:
        assert found[forward].status == "pass", found[forward].message
    parted = found[("causal", "future_gradients")]
    assert parted.status == "fail"
    assert "in the backward of a" in parted.message, parted.message
    assert "B's gradient reaches positions where A's is exactly zero" in parted.message
    located = parted.first_difference
    assert located is not None and located.backward and located.b_name == "h.1.attn.c_attn", located
    assert "first differing module going backward" in parted.message
    assert json.loads((Path(parted.reproduction) / "parting.json").read_text())["kind"] == "gradients"
    assert replay_parting(parted.reproduction, a=a, b=b).status == "fail"
    assert replay_parting(parted.reproduction, a=a, b=ported_plain_decoder()).status == "pass"


def test_generate_is_compared_step_by_step_until_the_two_choose_other_tokens():
    """OpenAI-GPT's generate() is what kv_cache checks (its generate() feeds the whole
    sequence): a copy agrees; a copy whose forward shifts the logits whenever a cache is
    asked for parts in generate() with its cache."""
    import copy

    from maskcheck.reference_models.hf_bugs import logits_shifted_with_cache
    from maskcheck.reference_models.hf_tiny import shrunk_model

    a = shrunk_model("openai-gpt", "causal-lm")
    clean = checks(compare(a, copy.deepcopy(a), ["kv_cache"], profile="dev"))[("kv_cache", "generate_use_cache")]
    assert clean.status == "pass" and "call(s) compared" in clean.message, clean.message
    b = logits_shifted_with_cache(copy.deepcopy(a))
    parted = checks(compare(a, b, ["kv_cache"], profile="dev"))[("kv_cache", "generate_use_cache")]
    assert parted.status == "fail", parted.message
    assert "B parts from A in generate() of" in parted.message and "with its cache" in parted.message
    assert parted.first_difference is None and "no matched module differs" in parted.message  # the shift is no module's


def test_two_backwards_part_where_exactly_one_gradient_is_zero():
    from maskcheck.harness.compare.gradients import compare_reach
    from maskcheck.harness.engine.tolerance import tolerance_for

    tolerance = tolerance_for("cpu", "float32")
    a = torch.tensor([[1.0, 0.5, 0.0, 0.0]], dtype=torch.float64)
    rounded = a * (1 + 1e-7)  # the same reach, other magnitudes: no parting
    assert not compare_reach(a, rounded, tolerance, "float32").parts
    assert not compare_reach(a, 3 * a, tolerance, "float32").parts  # a loss normaliser scales every gradient
    leaks = torch.tensor([[1.0, 0.5, 0.2, 0.0]], dtype=torch.float64)
    found = compare_reach(a, leaks, tolerance, "float32")
    assert found.parts and found.positions == [[0, 2]] and found.max_diff == pytest.approx(0.2)
    assert found.how.startswith("B's gradient reaches")
    blocked = compare_reach(a, torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64), tolerance, "float32")
    assert blocked.positions == [[0, 1]] and blocked.how.startswith("B's gradient is exactly zero")
    nan = compare_reach(a, torch.tensor([[1.0, 0.5, float("nan"), 0.0]], dtype=torch.float64), tolerance, "float32")
    assert nan.positions == [[0, 2]] and nan.max_diff == float("inf")


def test_the_cli_loads_a_port_s_weights_from_the_shipped_json_key_map(tmp_path, capsys):
    from maskcheck.reference_models.plain import PlainDecoder
    from maskcheck.reference_models.plain_port import port_key

    mapping = Path(__file__).resolve().parent.parent / "examples" / "plain-port-keys.json"
    assert json.loads(mapping.read_text()) == {name: port_key(name) for name in PlainDecoder().state_dict()}
    code = cli_main(
        ["compare", "module:maskcheck.reference_models.plain:plain_decoder",
         "module:maskcheck.reference_models.plain_port:ported_plain_decoder",
         "--suites", "causal,kv_cache", "--profile", "dev", "--weights", str(mapping), "--report", str(tmp_path)]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0, text
    assert "kv_cache         PASS" in text


def test_a_cache_that_decodes_one_position_off_parts_only_in_cached_decoding():
    name = "module_state_cache_position_off_by_one"
    a, b = mutants.build_clean(name), mutants.build(name)
    b.load_state_dict(a.state_dict())
    found = checks(compare(a, b, ["causal", "kv_cache"], profile="dev"))
    assert found[("causal", "future_tokens")].status == "pass"  # full forwards agree
    incremental = found[("kv_cache", "incremental")]
    assert incremental.status == "fail"
    assert "cached decoding, step 1" in incremental.message
    assert incremental.first_difference is not None and incremental.first_difference.a_name == "position"


def test_weights_are_loaded_under_a_mapping_with_every_tensor_placed():
    a, b = tiny_model("llama", "eager", seed=0), tiny_model("llama", "eager", seed=1)
    assert compare(a, b, ["causal"], profile="dev").exit_code == 1  # other weights: they part
    result = compare(a, b, ["causal"], profile="dev", weights=lambda name: name)
    assert result.exit_code == 0
    assert result.weights["read"] == len(a.state_dict()) and result.weights["loaded"] == len(a.state_dict())


def test_a_mapping_that_leaves_a_parameter_unloaded_is_refused_naming_it():
    a, b = tiny_model("llama", "eager", seed=0), tiny_model("llama", "eager", seed=1)
    dropped = "model.norm.weight"
    with pytest.raises(WeightsMismatch, match=r"1 parameters of B that no tensor of A loads: model\.norm\.weight"):
        load_weights(a, b, {dropped: None})
    with pytest.raises(WeightsMismatch, match="no parameter of that name in B"):
        load_weights(a, b, {dropped: "model.nowhere.weight"})


def test_two_different_models_are_refused():
    with pytest.raises(CompareError, match="not one model"):
        compare(tiny_model("llama"), tiny_model("t5"), ["causal"], profile="dev")


def test_modules_are_matched_by_order_and_shape_when_names_differ_or_by_a_map():
    same, other = torch.zeros(1, 2, 4), torch.ones(1, 2, 4)
    a = [Record("embed", same), Record("layers.0.norm", same), Record("layers.0.mlp", other)]
    b = [Record("tok", same), Record("extra", torch.zeros(3)), Record("blocks.0.ln", same), Record("blocks.0.ff", same)]
    found = first_difference(a, b, 1e-6, rows=1)
    assert found is not None and (found.a_name, found.b_name, found.matching) == (
        "layers.0.mlp",
        "blocks.0.ff",
        "order",
    )
    assert found.positions == [[0, 0], [0, 1]]
    mapped = first_difference(a, b, 1e-6, rows=1, mapping={"layers.0.mlp": "tok"})
    assert mapped is not None and mapped.matching == "mapping" and mapped.b_name == "tok"
    assert first_difference(a[:2], b, 1e-6, rows=1) is None


def test_the_cli_compares_two_specs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "compare.json"
    code = cli_main(
        ["compare", "ref:tiny-decoder", "ref:tiny-decoder", "--suites", "causal,kv_cache", "--profile", "dev",
         "--json", str(out)]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 0, text
    assert "kv_cache         PASS" in text
    assert json.loads(out.read_text())["status"] == "pass"


def test_the_cli_draws_where_a_port_parts(tmp_path, capsys):
    code = cli_main(
        ["compare", f"module:{PORTS}:llama", f"module:{PORTS}:gqa_repeat_llama",
         "--suites", "causal", "--profile", "dev", "--picture", str(tmp_path / "parting.png"),
         "--report", str(tmp_path)]
    )  # fmt: skip
    text = capsys.readouterr().out
    assert code == 1, text
    assert "first differing module: model.layers.0.self_attn.o_proj" in text
    assert (tmp_path / "parting.png").stat().st_size > 1000
    assert (tmp_path / "repro-compare-causal-future_tokens" / "test_repro_compare.py").is_file()


def test_a_parting_is_written_as_a_test_that_fails_on_its_own(tmp_path):
    result = compare(
        f"module:{PORTS}:llama", f"module:{PORTS}:rotary_wrong_half_llama", ["causal"], profile="dev",
        bundle_dir=tmp_path / "report",
    )  # fmt: skip
    parted = checks(result)[("causal", "future_tokens")]
    assert parted.status == "fail" and parted.reproduction is not None
    assert "reproduction: pytest" in parted.message
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    test_file = Path(parted.reproduction) / "test_repro_compare.py"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        cwd=elsewhere, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert run.returncode == 1, run.stdout + run.stderr  # a failure, not a setup error
    assert "1 failed" in run.stdout and "B parts from A in a forward" in run.stdout
    assert "model.layers.0.self_attn.o_proj" in run.stdout
    # the same call on a B without the divergence agrees: the test fails for the port's reason
    assert replay_parting(parted.reproduction, b=tiny_model("llama", "eager")).status == "pass"


def test_a_decode_parting_replays_its_operations_from_the_file(tmp_path):
    name = "module_state_cache_position_off_by_one"
    a, b = mutants.build_clean(name), mutants.build(name)
    b.load_state_dict(a.state_dict())
    result = compare(a, b, ["kv_cache"], profile="dev", bundle_dir=tmp_path)
    parted = checks(result)[("kv_cache", "incremental")]
    assert parted.status == "fail" and parted.reproduction is not None
    # models handed in as objects: the file says so, and replays on the models given to it
    assert "set A and B" in (Path(parted.reproduction) / "test_repro_compare.py").read_text()
    with pytest.raises(BundleError):
        replay_models(parted.reproduction)
    replayed = replay_parting(parted.reproduction, a=a, b=b)
    assert replayed.status == "fail" and "cached decoding, step 1" in replayed.message, replayed.report()
    assert replay_parting(parted.reproduction, a=a, b=a).status == "pass"


def test_a_comparison_that_compared_nothing_is_not_green():
    result = compare(tiny_model("llama"), tiny_model("llama", "sdpa"), ["cross_attention"], profile="dev")
    assert result.status == "not_applicable" and result.exit_code == 2


def test_the_cli_says_a_bad_spec_in_one_line(capsys):
    assert cli_main(["compare", "ref:tiny-decoder", "mutant:no-such-bug", "--suites", "causal"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("maskcheck: error:")
