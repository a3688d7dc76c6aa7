"""Exported ONNX graphs audited as deployed (``onnx:PATH``, ONNX Runtime's CPU provider): a
clean export gets its PyTorch model's verdict on every check both run, and compare verifies
an export against its model. The seeded export bugs are in the catalogue (tests/test_suites.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from maskcheck import audit, compare, load_adapter
from maskcheck.harness.adapters.hf import HFAdapter
from maskcheck.harness.adapters.specs import SpecError
from maskcheck.reference_models import onnx_exports
from maskcheck.reference_models.hf_tiny import tiny_model

pytest_plugins = ["pytester"]
pytest.importorskip("onnxruntime")  # the dev extra installs it (maskcheck[onnx] for users)

SUITES = ["causal", "padding", "kv_cache", "serving"]


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The clean exports, written once (a few seconds each)."""
    root = tmp_path_factory.mktemp("onnx")
    return {
        "gpt2": onnx_exports.export_hf("gpt2", root / "gpt2" / "model.onnx"),
        "llama": onnx_exports.export_hf("llama", root / "llama" / "model.onnx"),
        "llama_cached": onnx_exports.export_hf("llama", root / "llama_cached" / "model.onnx", cache=True),
        "gpt2_cached": onnx_exports.export_hf("gpt2", root / "gpt2_cached" / "model.onnx", cache=True),
        "cached": onnx_exports.export_cached(root / "cached" / "model.onnx"),
        "plain": onnx_exports.export_additive(root / "plain" / "model.onnx"),
    }


def verdicts(result) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {f"{s.name}/{c.name}": c.status for s in result.suites for c in s.checks if c.status != "not_applicable"}


def pytorch_model(name: str) -> object:
    """The model an export of ``name`` was written from."""
    if name == "cached":
        return onnx_exports.cached_model()
    if name == "plain":
        return onnx_exports.AdditiveMaskDecoder().eval()
    return HFAdapter(tiny_model(name.removesuffix("_cached"), "sdpa"))


@pytest.mark.parametrize("name", ["gpt2", "llama", "gpt2_cached", "llama_cached", "cached", "plain"])
def test_a_clean_export_gets_its_models_verdict_on_every_check_both_run(name: str, exports: dict[str, Path]) -> None:
    graph = audit(f"onnx:{exports[name]}", SUITES, paths=("canonical",))
    reference = audit(pytorch_model(name), SUITES, paths=("canonical",))
    graph_verdicts, model_verdicts = verdicts(graph), verdicts(reference)
    shared = graph_verdicts.keys() & model_verdicts.keys()
    assert {"causal/future_tokens", "padding/pad_ids", "padding/padded_vs_unpadded"} <= shared
    assert {check: graph_verdicts[check] for check in shared} == {check: model_verdicts[check] for check in shared}
    if name.endswith("cached"):
        assert {graph_verdicts[c] for c in ("kv_cache/incremental", "kv_cache/greedy_generation")} == {"pass"}


@pytest.mark.call_paths
def test_what_a_graph_cannot_do_says_why(exports: dict[str, Path]) -> None:
    result = audit(f"onnx:{exports['gpt2']}", ["causal", "kv_cache", "norm_checkpoint"])
    checks = {c.name: c for s in result.suites for c in s.checks}
    assert checks["future_gradients"].message == "an ONNX graph is run for inference only: it has no gradients to audit"
    assert "exported without a cache" in result.suite("kv_cache").checks[0].message
    assert result.suite("norm_checkpoint").status == "not_applicable"
    paths = {p["path"]: p["unavailable"] for p in result.environment["paths"]}
    assert "inputs have no defaults" in paths["bare_call"] and paths["mask_of_ones"] is None
    graph = load_adapter(f"onnx:{exports['gpt2']}").describe()["graph"]
    assert len(graph["sha256"]) == 64 and graph["opset"] and graph["producer"].startswith("pytorch")


def test_compare_verifies_an_export_against_its_model(exports: dict[str, Path]) -> None:
    spec = "module:maskcheck.reference_models.onnx_exports:cached_model"
    clean = compare(spec, f"onnx:{exports['cached']}", ["kv_cache"])
    assert clean.status == "pass", clean


def test_compare_names_the_module_where_an_export_parts(tmp_path: Path) -> None:
    """The dynamo exporter records each node's module (``name_scopes``): the module's output is
    exposed as a graph output and compared with the model's, so the first differing module is
    named, as between two PyTorch models (here where the cached padding is read: attention)."""
    spec = "module:maskcheck.reference_models.onnx_exports:cached_model"
    buggy = onnx_exports.export_cached(tmp_path / "model.onnx", forgets_cached_padding=True)
    result = compare(spec, f"onnx:{buggy}", ["kv_cache"], bundle_dir=tmp_path / "report")
    assert result.status == "fail"
    message = " ".join(check.message for suite in result.suites for check in suite.checks)
    assert "B parts from A in cached decoding" in message
    assert "first differing module: decoder.blocks.0.self_attn.o_proj" in message, message


def test_a_graph_with_its_weights_beside_it_is_audited(tmp_path: Path) -> None:
    graph = onnx_exports.export_additive(tmp_path / "model.onnx", external_data=True)
    assert (tmp_path / "model.onnx.data").is_file()
    assert audit(f"onnx:{graph}", ["padding"]).suite("padding").status == "pass"
    (tmp_path / "model.onnx.data").unlink()
    with pytest.raises(SpecError, match="weight file 'model.onnx.data' is missing beside it"):
        load_adapter(f"onnx:{graph}")


def test_a_file_that_is_no_graph_or_reads_outside_its_folder_is_one_line(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(b"\x08\x07not an onnx graph")
    with pytest.raises(SpecError, match="is not an ONNX graph"):
        load_adapter(f"onnx:{truncated}")
    weight = helper.make_tensor("w", TensorProto.FLOAT, [1], [1.0])
    weight.data_location = TensorProto.EXTERNAL
    weight.ClearField("float_data")
    weight.external_data.add(key="location", value="../outside.bin")
    graph = helper.make_graph(
        [helper.make_node("Identity", ["w"], ["logits"])], "g", [],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1])], [weight],
    )  # fmt: skip
    escaping = tmp_path / "folder" / "model.onnx"
    escaping.parent.mkdir()
    onnx.save(helper.make_model(graph), str(escaping))
    with pytest.raises(SpecError, match="lies outside the graph's folder; not read"):
        load_adapter(f"onnx:{escaping}")
    with pytest.raises(SpecError, match="no such ONNX file"):
        load_adapter(f"onnx:{tmp_path / 'missing.onnx'}")


def test_the_plugin_audits_an_export_like_any_spec(pytester: pytest.Pytester, exports: dict[str, Path]) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    spec = f"onnx:{exports['llama_cached']}"
    result = pytester.runpytest_subprocess(
        "-p", "no:xdist", "-p", "no:cacheprovider", "--maskcheck-model", spec, "--maskcheck-suites", "causal,kv_cache",
        "--maskcheck-profile", "dev",
    )  # fmt: skip
    outcomes = result.parseoutcomes()
    assert outcomes["passed"] == 3 and "failed" not in outcomes, result.stdout.str()[-3000:]
    assert "no gradients to audit" in result.stdout.str()  # what a graph cannot run is said, as a warning
