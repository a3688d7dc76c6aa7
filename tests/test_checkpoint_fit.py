"""norm_checkpoint's load evidence for Hugging Face checkpoints: every tensor is used,
every parameter comes from the checkpoint, and a misfit names the class the names fit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from maskcheck import audit
from maskcheck.reference_models.hf_tiny import shrunk_config


def checkpoint(directory: Path, model_type: str, load_as: tuple[str, str] | None = None) -> Path:
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(shrunk_config(model_type)).save_pretrained(directory)
    if load_as:  # a hand-written config that names another class, as a conversion script might
        config = json.loads((directory / "config.json").read_text())
        config["model_type"], config["architectures"] = load_as[0], [load_as[1]]
        (directory / "config.json").write_text(json.dumps(config))
    return directory


def edit_tensors(directory: Path, add: str | None = None, drop: str | None = None) -> None:
    file = directory / "model.safetensors"
    tensors = load_file(str(file))
    if add:
        tensors[add] = torch.zeros(4)
    if drop:
        del tensors[drop]
    save_file(tensors, str(file), metadata={"format": "pt"})


def load_check(directory: Path):  # type: ignore[no-untyped-def]
    return next(
        c for c in audit(f"hf:{directory}", ["norm_checkpoint"]).suite("norm_checkpoint").checks if c.name == "load"
    )


def test_a_checkpoint_that_fits_its_class_passes(tmp_path: Path) -> None:
    assert load_check(checkpoint(tmp_path, "llama")).status == "pass"


def test_olmo2_weights_under_a_llama_config_fail_and_name_the_classes_they_fit(tmp_path: Path) -> None:
    check = load_check(checkpoint(tmp_path, "olmo2", ("llama", "LlamaForCausalLM")))
    assert check.status == "fail"
    assert "does not fit LlamaForCausalLM" in check.message and "self_attn.q_norm.weight" in check.message
    assert "initialised at random): model.layers.0.input_layernorm.weight" in check.message
    assert "its tensor names fit" in check.message and "Olmo2ForCausalLM" in check.message


@pytest.mark.parametrize(
    "change", [{"add": "model.layers.1.extra.weight"}, {"drop": "model.layers.1.mlp.down_proj.weight"}]
)
def test_an_extra_or_a_missing_tensor_fails_load(tmp_path: Path, change: dict) -> None:
    edit_tensors(checkpoint(tmp_path, "llama"), **change)
    check = load_check(tmp_path)
    assert check.status == "fail" and next(iter(change.values())) in check.message
