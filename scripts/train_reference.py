"""Train a small reference model on a synthetic task and save it as a safetensors checkpoint.

    python scripts/train_reference.py OUT.safetensors [--task copy_spans] [--steps 700]
        [--seed 0] [--length 32] [--schedule constant] [--set norm_layout=post --set d_model=64 ...]

The shipped retrieval model (reference_models/checkpoints/kv-retrieval.safetensors) is

    python scripts/train_reference.py reference_models/checkpoints/kv-retrieval.safetensors \
        --task kv_retrieval --steps 1600 --length 64 --schedule cosine \
        --set vocab_size=128 --set max_seq_len=256

The checkpoint records its config, its fingerprint and the training run (task, steps,
seed, length, learning rate, schedule) in its metadata, so anyone can retrain it on a CPU
(one torch thread: the same seed gives the same weights on the same torch build).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict

import torch

from maskcheck.harness.adapters.specs import SpecError, override_config
from maskcheck.reference_models import ModelConfig, save_checkpoint
from maskcheck.reference_models.retrieval import VOCAB_KEY, RetrievalVocab
from maskcheck.reference_models.training import TASKS, TrainingRun, train


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="the .safetensors file to write")
    parser.add_argument("--task", default="copy_spans", choices=sorted(TASKS))
    parser.add_argument("--steps", type=int, default=700)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--length", type=int, default=32, help="training sequence length (kv_retrieval: the longest)")
    parser.add_argument("--schedule", default="constant", choices=["constant", "cosine"])
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="a ModelConfig field (default config: token_shift=true, d_model=64)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    changes = dict(item.split("=", 1) for item in args.set)
    try:
        config = override_config(ModelConfig(token_shift=True, d_model=64), changes)
    except SpecError as exc:
        print(f"train_reference: {exc}", file=sys.stderr)
        return 2
    run = TrainingRun(config, args.task, args.steps, args.seed, length=args.length, lr=args.lr, schedule=args.schedule)
    started = time.perf_counter()
    model = train(run, log=lambda step, loss: print(f"step {step:>5}  loss {loss:.3f}", flush=True))
    record = {k: v for k, v in asdict(run).items() if k != "config"}
    metadata = {"maskcheck.training": json.dumps(record)}
    if args.task == "kv_retrieval":
        metadata[VOCAB_KEY] = RetrievalVocab().to_json()
    path = save_checkpoint(model, args.out, metadata)
    print(f"{path}: trained in {time.perf_counter() - started:.1f}s ({record})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
