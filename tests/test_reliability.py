"""Bad input, untrusted checkpoints, partial failures, determinism."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from maskcheck import audit
from maskcheck.harness.adapters.base import Capabilities
from maskcheck.harness.adapters.module import ModuleAdapter
from maskcheck.harness.adapters.outputs import PROBE_LENGTHS
from maskcheck.harness.adapters.specs import LoadOptions, SpecError, load_adapter, parse_spec
from maskcheck.harness.cli import main
from maskcheck.reference_models import PRESETS, Transformer
from maskcheck.reference_models.hf_tiny import tiny_model

SENTINEL = "maskcheck-pickle-ran"


class Exploit:
    """A pickle payload that would create a file when unpickled without weights_only."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.path, "w"))


def test_hf_pickle_weights_need_allow_pickle_and_load_tensors_only(tmp_path: Path) -> None:
    model = tiny_model("llama")
    model.save_pretrained(tmp_path, safe_serialization=True)
    for file in tmp_path.glob("*.safetensors"):
        file.unlink()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    with pytest.raises(SpecError, match="refused; pass --allow-pickle") as info:
        load_adapter(f"hf:{tmp_path}")
    assert "\n" not in str(info.value)
    adapter = load_adapter(f"hf:{tmp_path}", LoadOptions(allow_pickle=True))
    ids = torch.tensor([[3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(adapter.model(input_ids=ids).logits, model(input_ids=ids).logits)
    # A pickle that runs code is refused even with --allow-pickle, and the code never runs.
    torch.save({"model.embed_tokens.weight": Exploit(str(tmp_path / SENTINEL))}, tmp_path / "pytorch_model.bin")
    with pytest.raises(SpecError, match=r"weights_only=True"):
        load_adapter(f"hf:{tmp_path}", LoadOptions(allow_pickle=True))
    assert not (tmp_path / SENTINEL).exists()


def test_reference_pickle_checkpoint(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = Transformer(PRESETS["tiny-decoder"])
    path = tmp_path / "model.pt"
    torch.save({"config": model.config.to_dict(), "state_dict": model.state_dict()}, path)
    assert main(["audit", f"ref:{path}", "--suites", "causal", "-q"]) == 2
    assert "--allow-pickle" in capsys.readouterr().err
    assert main(["audit", f"ref:{path}", "--suites", "causal", "--allow-pickle", "-q"]) == 0
    torch.save(Exploit(str(tmp_path / SENTINEL)), path)
    assert main(["audit", f"ref:{path}", "--allow-pickle", "-q"]) == 2
    assert "weights_only=True" in capsys.readouterr().err and not (tmp_path / SENTINEL).exists()


def test_corrupt_and_unsupported_checkpoints_are_one_line_errors(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    tiny_model("llama").save_pretrained(tmp_path / "truncated", safe_serialization=True)
    weights = next((tmp_path / "truncated").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:1000])
    (tmp_path / "unknown").mkdir()
    (tmp_path / "unknown" / "config.json").write_text(json.dumps({"model_type": "not-a-real-architecture"}))
    (tmp_path / "unknown" / "model.safetensors").write_bytes(b"")
    (tmp_path / "bad.safetensors").write_bytes(b"\x00" * 10)
    for spec, message in [
        (f"hf:{tmp_path / 'truncated'}", "cannot read the weights"),
        (f"hf:{tmp_path / 'unknown'}", "unsupported or unknown architecture"),
        (f"ref:{tmp_path / 'bad.safetensors'}", "not a readable safetensors file"),
    ]:
        assert main(["audit", spec, "-q"]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    "forward, status, words",
    [
        # measured [B, T, 8] at the probe's lengths, another width at the audit's
        (
            lambda ids, mask: torch.zeros(*ids.shape, 8 if ids.shape[1] in PROBE_LENGTHS else 5),
            "error",
            "expected [B, T, V]",
        ),
        (lambda ids, mask: torch.full((*ids.shape, 8), float("inf")), "fail", "NaN/inf"),
        (lambda ids, mask: (_ for _ in ()).throw(ValueError("bad input")), "error", "bad input"),
        (
            lambda ids, mask: (_ for _ in ()).throw(torch.OutOfMemoryError("CUDA out of memory")),
            "error",
            "lower the batch size",
        ),
    ],
)
def test_a_misbehaving_model_gets_a_verdict_and_the_audit_goes_on(forward, status: str, words: str) -> None:  # type: ignore[no-untyped-def]
    result = audit(
        ModuleAdapter(forward, Capabilities(family="decoder", vocab_size=8), mask_convention="keep"),
        ["causal", "padding", "packing"],
    )
    first = result.suites[0]
    assert first.status == status, [(c.name, c.status, c.message) for c in first.checks]
    assert any(words in c.message for c in first.checks)
    assert [s.name for s in result.suites] == ["causal", "padding", "packing"]  # the others still ran
    assert result.exit_code == 1


def test_a_model_that_claims_a_cache_but_ignores_it_fails_kv_cache() -> None:
    """Capabilities that lie: step() recomputes from the new tokens alone, forgetting the prefix."""
    from maskcheck.harness.adapters.reference import ReferenceAdapter

    class Forgetful(ReferenceAdapter):
        def _step(self, state, tokens, attention_mask):  # type: ignore[no-untyped-def]
            logits = self.model(tokens).logits
            return logits, state

    torch.manual_seed(0)
    result = audit(Forgetful(Transformer(PRESETS["tiny-decoder"])), ["kv_cache"])
    check = result.suite("kv_cache").checks[0]
    assert check.status == "fail" and "cached decoding" in check.message


def test_a_cache_path_that_returns_mixed_rows_fails_kv_cache_while_a_wrong_shape_everywhere_is_an_error() -> None:
    """RWKV's cached forward of one token broadcasts a [B, H] state against [B, 1, H] and returns
    [B, B, V]: a defect of the cache path (the full forward has the right shape), not a harness error."""
    from maskcheck.harness.adapters.reference import ReferenceAdapter

    class RowMixing(ReferenceAdapter):
        def _step(self, state, tokens, attention_mask):  # type: ignore[no-untyped-def]
            logits, state = super()._step(state, tokens, attention_mask)
            rows = logits.shape[0]
            return logits[None, :, -1].expand(rows, rows, -1) if tokens.shape[
                1
            ] == 1 else logits, state  # [B, B, V]: right for one row

    torch.manual_seed(0)
    model = Transformer(PRESETS["tiny-decoder"])
    checks = {c.name: c for c in audit(RowMixing(model), ["kv_cache"]).suite("kv_cache").checks}
    for check in checks.values():
        assert (
            check.status == "fail"
            and "the full forward of this case's rows (no cache) returns the right shape" in check.message
        ), check.message

    class WrongEverywhere(RowMixing):
        def _logits(self, batch):  # type: ignore[no-untyped-def]
            logits = super()._logits(batch)
            return torch.cat([logits, logits[:, :1]], dim=1)  # [B, T + 1, V]

    assert {c.status for c in audit(WrongEverywhere(model), ["kv_cache"]).suite("kv_cache").checks} == {"error"}


def test_ctrl_c_keeps_the_verdicts_that_finished(tmp_path: Path) -> None:
    """A KeyboardInterrupt in the second suite: exit 130, and the report names what did not run."""
    (tmp_path / "interrupting.py").write_text(
        "import torch\n"
        "from maskcheck.harness.adapters.base import Capabilities\n"
        "from maskcheck.harness.adapters.module import ModuleAdapter\n"
        "def build():\n"
        "    def forward(ids, mask):\n"
        "        if mask is not None and bool(((ids != 0) & (mask == 0)).any()):  # other ids at padded slots: padding/pad_ids\n"
        "            raise KeyboardInterrupt\n"
        "        return torch.zeros(*ids.shape, 8)\n"
        "    return ModuleAdapter(forward, Capabilities(family='decoder', vocab_size=8), mask_convention='keep')\n"
    )
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "maskcheck",
            "audit",
            "module:interrupting:build",
            "--suites",
            "causal,padding,loss_masking",
            "--json",
            "r.json",
            "-q",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 130, completed.stderr
    assert (
        "interrupted; the suites that finished are in r.json" in completed.stderr
        and "Traceback" not in completed.stderr
    )
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["complete"] is False
    assert [s["name"] for s in report["suites"]] == ["causal"] and report["not_run"] == ["padding", "loss_masking"]


def test_same_spec_seed_and_profile_give_the_same_report() -> None:
    def stripped(spec: str) -> dict:
        report = audit(spec, ["causal", "padding", "kv_cache", "packing"], profile="ci", seed=7).to_dict()
        for suite in report["suites"]:
            suite.pop("seconds")
        report.pop("run_id"), report.pop("started")  # which run, and when: the rest must be the same
        return report

    assert stripped("mutant:packing_boundary_off_by_one") == stripped("mutant:packing_boundary_off_by_one")


@pytest.mark.slow  # a minute: the serial and the -n 2 plugin runs of four models; test_plugin covers -n 2
def test_parallel_plugin_run_gives_the_serial_verdicts(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_own="def test_own():\n    assert True\n")
    verdicts = []
    for args in (["-p", "no:xdist"], ["-n", "2"]):
        report_dir = f"report-{len(verdicts)}"
        pytester.runpytest_subprocess(
            *args,
            "-p",
            "no:cacheprovider",
            "--maskcheck-model",
            "mutant:kv_cache_appended_twice",
            "--maskcheck-suites",
            "kv_cache,padding,causal",
            "--maskcheck-report-dir",
            report_dir,
        )
        report = json.loads((pytester.path / report_dir / "mutant_kv_cache_appended_twice" / "report.json").read_text())
        verdicts.append(
            sorted((s["name"], c["name"], c["status"], c["message"]) for s in report["suites"] for c in s["checks"])
        )
    assert verdicts[0] == verdicts[1]


pytest_plugins = ["pytester"]


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=40))
def test_spec_parser_fuzz(text: str) -> None:
    try:
        parsed = parse_spec(text)
    except SpecError as exc:
        assert "\n" not in str(exc)
    else:
        assert parsed.scheme in ("ref", "mutant", "hf", "module") and parsed.target


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["ref", "mutant", "hf", "module"]), st.text(alphabet="abc:/._-\\ x0", max_size=20))
def test_spec_loader_fuzz_raises_only_spec_errors(scheme: str, target: str) -> None:
    try:
        load_adapter(f"{scheme}:{target}")
    except SpecError as exc:
        assert "\n" not in str(exc)
