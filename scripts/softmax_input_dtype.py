"""Does a softmax computed in bfloat16 differ from one computed in float32 and cast back?

    python scripts/softmax_input_dtype.py [--device cpu|cuda] [--dtype bfloat16|float16]

Plain torch, no maskcheck: the measurement behind compare's answer to the seeded
"softmax in the input dtype" port (docs/compare.md). For rows of 8 to 4096 scores
(``randn * 4``, seeded), it prints whether ``torch.softmax(x)`` on the low-precision ``x`` is
bit for bit ``torch.softmax(x, dtype=torch.float32).to(x.dtype)`` (transformers' eager
attention), and the largest error of a probability against the float32 softmax (absolute:
a probability is at most 1, and a relative error is dominated by float16's underflow) of
three ways:
that cast, ``torch.softmax`` in the input dtype, and a softmax written out by hand in the
input dtype (``exp(x - max) / sum``, every step rounded to it), in units of the dtype's eps.

``--tiny-llama`` adds the effect on a model: the tiny Llama of
``reference_models/hf_tiny.py`` with its query and key weights scaled by 1, 4 and 16
(sharper attention), 4 rows of 48 tokens, the largest log-probability difference from
eager in the dtype of the softmax by hand, of sdpa, and of float32.
"""

from __future__ import annotations

import argparse

import torch


def by_hand(x: torch.Tensor) -> torch.Tensor:
    exponentials = (x - x.amax(-1, keepdim=True)).exp()
    return exponentials / exponentials.sum(-1, keepdim=True)


def tiny_llama_differences(device: str, dtype: torch.dtype) -> None:
    from maskcheck.reference_models.hf_tiny import tiny_model
    from maskcheck.reference_models.ports import attention_with, llama_with_attention, repeat_kv

    builders = {
        "eager": lambda: tiny_model("llama", "eager"),
        "sdpa": lambda: tiny_model("llama", "sdpa"),
        "by hand": lambda: llama_with_attention("maskcheck_softmax_by_hand", attention_with(repeat_kv, by_hand)),
        "float32": lambda: tiny_model("llama", "eager"),
    }
    ids = torch.randint(0, 64, (4, 48), generator=torch.Generator().manual_seed(0)).to(device)
    print("tiny Llama: largest |d log p| from eager in the dtype")
    print(f"{'q, k x':>7}  {'by hand':>8}  {'sdpa':>8}  {'float32':>8}")
    for sharpness in (1, 4, 16):
        log_probs = {}
        for name, build in builders.items():
            model = build().to(device)
            with torch.no_grad():
                for layer in model.model.layers:
                    layer.self_attn.q_proj.weight.mul_(sharpness)
                    layer.self_attn.k_proj.weight.mul_(sharpness)
                # float32: the same weights, rounded to the dtype, computed in float32
                model = model.to(dtype).float() if name == "float32" else model.to(dtype)
                log_probs[name] = torch.log_softmax(model(ids).logits.float(), -1)
        eager = log_probs.pop("eager")
        row = "  ".join(f"{float((eager - other).abs().max()):8.4f}" for other in log_probs.values())
        print(f"{sharpness:>7}  {row}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--tiny-llama", action="store_true", help="also measure the effect on the tiny Llama")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    eps = torch.finfo(dtype).eps
    generator = torch.Generator().manual_seed(0)
    print(f"torch {torch.__version__}, {args.device}, {args.dtype}: largest |p - p_float32|, in eps")
    print(f"{'scores':>7}  {'in dtype = cast':>15}  {'cast':>6}  {'in dtype':>8}  {'by hand':>7}")
    for length in (8, 64, 512, 4096):
        x = (torch.randn(64, length, generator=generator) * 4).to(device=args.device, dtype=dtype)  # [rows, scores]
        exact = torch.softmax(x.float(), -1)

        def error(p: torch.Tensor, exact: torch.Tensor = exact) -> float:
            return float((p.float() - exact).abs().max()) / eps

        cast = torch.softmax(x, -1, dtype=torch.float32).to(dtype)
        native = torch.softmax(x, -1)
        equal = "bit for bit" if torch.equal(native, cast) else "differs"
        print(f"{length:>7}  {equal:>15}  {error(cast):6.2f}  {error(native):8.2f}  {error(by_hand(x)):7.2f}")
    if args.tiny_llama:
        tiny_llama_differences(args.device, dtype)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
