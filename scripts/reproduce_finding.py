"""Reproduce a finding of the architecture sweep with plain transformers calls (no maskcheck).

    python scripts/reproduce_finding.py TYPE SUITE [--implementation eager] [--task causal-lm]

It rebuilds the model the sweep audited (the config recorded in docs/architectures.jsonl,
random weights, seed 0) and runs one direct check of the suite's property on it, printing
the largest change of a log-probability that must not change. Everything below is torch
and transformers, so the finding stands without maskcheck:

| suite | what must not change |
|---|---|
| causal | logits before position 4 when the token at position 5 changes |
| padding | real logits when the ids in left-padded slots change (mask given) |
| packing | sequence B's logits when sequence A, packed before it in one row, changes |
| kv_cache | the last two logits of a 6-token forward vs 4 tokens prefilled, then a chunk of 2 with the cache |
| loss_masking | the model's loss vs cross-entropy of logits[t] against labels[t + 1], -100 ignored |
"""

from __future__ import annotations

import argparse
import inspect
import json
from pathlib import Path

import torch
import torch.nn.functional as F

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "architectures.jsonl"


def build(model_type: str, task: str, implementation: str, results: Path) -> torch.nn.Module:
    import transformers

    record = next(
        (r for r in map(json.loads, results.read_text().splitlines()) if (r["type"], r["task"]) == (model_type, task) and "config" in r),
        None,
    )
    if record is None:
        raise SystemExit(f"{model_type} ({task}) is not in {results}: run scripts/architecture_sweep.py --types {model_type}")
    config = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in record["config"].items() if k != "model_type"})
    auto = {"causal-lm": transformers.AutoModelForCausalLM, "masked-lm": transformers.AutoModelForMaskedLM, "seq2seq": transformers.AutoModelForSeq2SeqLM}[task]
    torch.manual_seed(0)
    kwargs = {} if implementation == "default" else {"attn_implementation": implementation}
    return auto.from_config(config, **kwargs).eval()


def log_probs(model: torch.nn.Module, **inputs: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return F.log_softmax(model(**inputs).logits.double(), dim=-1)


def takes(model: torch.nn.Module, name: str) -> bool:
    parameters = inspect.signature(type(model).forward).parameters
    return name in parameters


def ids(model: torch.nn.Module, length: int, seed: int = 0) -> torch.Tensor:
    vocab = model.get_output_embeddings().weight.shape[0] if model.get_output_embeddings() is not None else model.config.vocab_size
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(seed))


def causal(model: torch.nn.Module) -> float:
    row = ids(model, 8)
    changed = row.clone()
    changed[0, 5] = (changed[0, 5] + 1) % model.config.vocab_size
    return float((log_probs(model, input_ids=row)[:, :5] - log_probs(model, input_ids=changed)[:, :5]).abs().max())


def padding(model: torch.nn.Module) -> float:
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    real = ids(model, 6)
    row = torch.cat([torch.full((1, 2), pad), real], dim=1)
    other = torch.cat([torch.full((1, 2), (pad + 5) % model.config.vocab_size), real], dim=1)
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
    return float((log_probs(model, input_ids=row, attention_mask=mask)[:, 2:] - log_probs(model, input_ids=other, attention_mask=mask)[:, 2:]).abs().max())


def packing(model: torch.nn.Module) -> float:
    first, second = ids(model, 4, seed=1), ids(model, 4, seed=2)
    changed = (first + 1) % model.config.vocab_size
    inputs = {}
    if takes(model, "position_ids"):  # the padding-free path: positions restart per sequence
        inputs["position_ids"] = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3]])
    a = log_probs(model, input_ids=torch.cat([first, second], 1), **inputs)[:, 4:]
    b = log_probs(model, input_ids=torch.cat([changed, second], 1), **inputs)[:, 4:]
    return float((a - b).abs().max())


def kv_cache(model: torch.nn.Module) -> float:
    row = ids(model, 6)
    with torch.no_grad():
        full = model(input_ids=row, use_cache=False).logits[:, -2:]
        prefill = model(input_ids=row[:, :4], use_cache=True)
        step = model(input_ids=row[:, 4:], past_key_values=prefill.past_key_values, use_cache=True).logits
    return float((F.log_softmax(full.double(), -1) - F.log_softmax(step.double(), -1)).abs().max())


def loss_masking(model: torch.nn.Module) -> float:
    row = ids(model, 8)
    labels = row.clone()
    labels[0, :2] = -100
    with torch.no_grad():
        output = model(input_ids=row, labels=labels)
    logits = output.logits[:, :-1].double()
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100)
    return float((output.loss.double() - expected).abs())


CHECKS = {"causal": causal, "padding": padding, "packing": packing, "kv_cache": kv_cache, "loss_masking": loss_masking}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("type")
    parser.add_argument("suite", choices=sorted(CHECKS))
    parser.add_argument("--task", default="causal-lm", choices=["causal-lm", "masked-lm", "seq2seq"])
    parser.add_argument("--implementation", default="default")
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = build(args.type, args.task, args.implementation, args.results)
    difference = CHECKS[args.suite](model)
    verdict = "changes (a finding)" if difference > 1e-4 else "does not change"
    print(f"{args.type} ({type(model).__name__}, {args.implementation} attention) {args.suite}: max |difference| = {difference:.3g}: {verdict}")
    return 1 if difference > 1e-4 else 0


if __name__ == "__main__":
    raise SystemExit(main())
