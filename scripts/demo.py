"""The main job of the quick start: audit reference and Hugging Face models through the CLI.

Writes a tiny random-init Hugging Face GPT-2 and a reference checkpoint to .demo/ (as
safetensors, the way third-party checkpoints arrive), audits them, then audits one
seeded bug to show what a failure looks like. Exits non-zero if a clean model fails
or the seeded bug is not caught.
"""

from __future__ import annotations

import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
ROOT = Path(__file__).resolve().parent.parent

from maskcheck.harness.cli import main
from maskcheck.harness.cli.quiet import quiet_transformers
from maskcheck.reference_models import Transformer, preset, save_checkpoint
from maskcheck.reference_models.hf_tiny import tiny_model


def write_checkpoints(directory: Path) -> tuple[Path, Path]:
    quiet_transformers()  # else the checkpoint written first prints a progress bar before maskcheck's first line
    hf_dir = directory / "tiny-gpt2"
    tiny_model("gpt2").save_pretrained(hf_dir, safe_serialization=True)
    reference = save_checkpoint(
        Transformer(preset("tiny-encoder-decoder")), directory / "tiny-encoder-decoder.safetensors"
    )
    return hf_dir, reference


def run(argv: list[str]) -> int:
    print(f"\n$ maskcheck {' '.join(argv)}", flush=True)
    return main(argv)


def demo() -> int:
    hf_dir, reference = write_checkpoints(ROOT / ".demo")
    clean = [
        run(["audit", "ref:tiny-decoder", "-q"]),
        run(["audit", f"ref:{reference}", "-q"]),
        run(["audit", f"hf:{hf_dir}", "--attn-implementation", "eager,sdpa", "-q"]),
    ]
    seeded = run(["audit", "mutant:causal_sees_next_token", "--suites", "causal", "-q"])
    ok = all(code == 0 for code in clean) and seeded == 1
    print(
        f"\ndemo: clean models {'passed' if all(c == 0 for c in clean) else 'FAILED'}; "
        f"the seeded bug was {'caught' if seeded == 1 else 'MISSED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(demo())
