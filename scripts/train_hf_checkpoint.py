"""Train a tiny Hugging Face causal LM to continue repeated sequences, and save it as a checkpoint directory.

    python scripts/train_hf_checkpoint.py reference_models/checkpoints/hf-llama --model-type llama
    python scripts/train_hf_checkpoint.py reference_models/checkpoints/hf-gemma --model-type gemma --steps 8000

The shipped checkpoints (config.json + model.safetensors, a few hundred KB) are made by
exactly these two commands. They exist so that norm_checkpoint's ``behaviour`` evidence can be
tested on Hugging Face weights that predict something: trained on random token sequences
repeated twice (``[x, x]``, loss on the second copy), a two-layer model forms induction heads,
which is what the probe measures. Plain attention without a token shift needs a few thousand
steps for that (Gemma, whose embeddings are scaled by sqrt(hidden), about 2,000 to Llama's 1,000
at this width), so the checkpoints are trained once and shipped, not trained in CI.

One torch thread and a fixed seed: the same torch build gives the same weights. The run's
arguments are written to ``training.json`` beside the weights.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

#: the widths of both shipped checkpoints; each type's own defaults fill in the rest
#: (Gemma: RMSNorm as 1 + w, embeddings scaled by sqrt(hidden), GELU; Llama: w, no scale, SiLU)
DIMENSIONS: dict[str, Any] = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
FIRST_ID = 1  # every id but the pad id (0), as the probe draws them


def repeated_batch(generator: torch.Generator, batch: int, longest_half: int, vocab: int) -> tuple[torch.Tensor, int]:
    """``[x, x]`` rows of a random half length (4 to ``longest_half``): ids ``[B, 2h]`` and h."""
    half = int(torch.randint(4, longest_half + 1, (1,), generator=generator))
    first = torch.randint(FIRST_ID, vocab, (batch, half), generator=generator)
    return torch.cat([first, first], dim=1), half


def train(
    model: torch.nn.Module, steps: int, seed: int, lr: float, batch: int, longest_half: int, log_every: int = 250
) -> float:
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    vocab = model.config.vocab_size
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(1, steps + 1):
        for group in optimiser.param_groups:  # cosine decay after a short warm-up
            group["lr"] = lr * min(1.0, step / 100) * 0.5 * (1 + math.cos(math.pi * step / steps))
        ids, half = repeated_batch(generator, batch, longest_half, vocab)
        logits = model(input_ids=ids).logits  # [B, 2h, V]
        # position t predicts t + 1; only the second copy can be predicted
        loss = F.cross_entropy(logits[:, half:-1].reshape(-1, vocab), ids[:, half + 1 :].reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        if step % log_every == 0 or step == steps:
            print(
                f"step {step:>5}  loss on the second copy {loss.item():.3f} (chance {math.log(vocab):.3f})", flush=True
            )
    model.eval()
    return loss.item()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the checkpoint directory to write")
    parser.add_argument("--model-type", default="llama", help="a causal-LM model type of transformers (default: llama)")
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--longest-half", type=int, default=24, help="the longest sequence before it repeats")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a config field (JSON value), on top of the shared widths",
    )
    args = parser.parse_args(argv)
    import transformers

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    changes = {key: json.loads(value) for key, value in (item.split("=", 1) for item in args.set)}
    config = transformers.AutoConfig.for_model(args.model_type, **{**DIMENSIONS, **changes})
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    started = time.perf_counter()
    final = train(model, args.steps, args.seed, args.lr, args.batch, args.longest_half)
    model.config._attn_implementation = None  # a loader chooses its own attention implementation
    model.save_pretrained(args.out)
    record = {
        "script": "scripts/train_hf_checkpoint.py",
        **{k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"},
    }
    record.update(
        final_loss=round(final, 4),
        seconds=round(time.perf_counter() - started, 1),
        torch=torch.__version__,
        transformers=transformers.__version__,
    )
    (args.out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{args.out}: trained in {record['seconds']} s, final loss {final:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
