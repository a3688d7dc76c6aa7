"""Measure the noise floors behind the default tolerance table (harness/engine/tolerance.py).

Runs every check of the mask, packing and kv_cache suites on clean models (reference presets and tiny
Hugging Face models, eager and sdpa) in float32, bfloat16 and float16 on this CPU (or
on a GPU with ``--device cuda``: the floors behind the CUDA rows of the table), and
prints the largest difference of each kind in units of ``eps(dtype) * scale``: the
numbers the ``*_ulps`` defaults must stay well above. For bfloat16 and float16 it also
prints FlashAttention's reference error (``vs_float32``), as every low-precision audit
measures it (maskcheck.harness.engine.tolerance.measure_reference_error): the low-precision model against
a float32 copy of the same weights on one batch. A shape-changing comparison puts two
low-precision computations side by side, each within that error of the float32 result,
so the shape-changing threshold must stay above twice it. Clean models only: any
difference measured here is floating-point noise, not a leak.

    python scripts/noise_floor.py [--examples 10] [--device cpu|cuda] [--heads]

``--heads`` measures the clean models of other output kinds instead (classifiers, reward
models, taggers, embeddings: reference_models/heads.py), whose outputs are compared in
their own units (raw values, or log-probabilities of class scores).
"""

from __future__ import annotations

import argparse
import warnings
from collections import defaultdict

warnings.filterwarnings("ignore")

import torch
from hypothesis import HealthCheck, Phase, given, settings

from maskcheck.harness.adapters.specs import adapter_for, call_factory
from maskcheck.harness.engine.registry import load_suite, suite_names
from maskcheck.harness.engine.suite import Check, RunContext
from maskcheck.harness.engine.tolerance import Tolerance, measure_reference_error
from maskcheck.reference_models import PRESETS, Transformer
from maskcheck.reference_models.heads import CLEAN_HEADS
from maskcheck.reference_models.hf_tiny import TINY_CONFIGS, tiny_model
from maskcheck.suites.pooling import measure_pooling

# threshold = eps * scale exactly, so outcome.ratio is the difference in units of eps * scale.
UNIT = Tolerance(same_shape_ulps=1, shape_change_k=0, shape_change_ulps=1)
SHAPE_CHANGING = {
    "padded_vs_unpadded",
    "extra_padding",
    "batch_composition",
    "source_padding_amount",
    "reference_loss",
    "segments_alone",
    "packed_vs_padded",
    "incremental",
    "greedy_generation",
}
#: checks that measure no floating-point difference (influence patterns, settings reports, layout evidence)
NOT_NOISE = {"declared_pattern", "positions_from_mask", "settings", "metadata", "fingerprint", "behaviour"}


def head_models(dtype: torch.dtype, device: str):  # type: ignore[no-untyped-def]
    for spec in CLEAN_HEADS:
        yield spec.rsplit(":", 1)[1], call_factory(spec.removeprefix("module:")).to(device=device, dtype=dtype)


def models(dtype: torch.dtype, device: str):  # type: ignore[no-untyped-def]
    for name, config in PRESETS.items():
        torch.manual_seed(0)
        yield f"ref:{name}", Transformer(config).to(device=device, dtype=dtype)
    for name in TINY_CONFIGS:
        for implementation in ("eager", "sdpa"):
            yield f"hf:{name}/{implementation}", tiny_model(name, implementation).to(device=device, dtype=dtype)


def measure(check: Check, examples: int) -> float:
    worst = 0.0

    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    @given(check.strategy)
    def run(case):  # type: ignore[no-untyped-def]
        nonlocal worst
        outcome = check.outcome(case)
        # A warn is a left-padding position shift (a known behaviour, not noise); any other
        # outcome, fail included, is a measurement: the unit threshold makes most of them fail.
        if outcome.threshold > 0 and outcome.status != "warn":
            worst = max(worst, outcome.ratio)

    run()
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=10)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--heads", action="store_true", help="the clean models of other output kinds instead")
    args = parser.parse_args()
    suites = [load_suite(n) for n in suite_names(lambda suite: suite.in_sweep)]
    print(f"{'dtype':<10} {'kind':<14} {'worst (eps*scale)':>18}  where")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        worst: dict[str, tuple[float, str]] = defaultdict(lambda: (0.0, ""))
        for spec, model in (head_models if args.heads else models)(dtype, args.device):
            adapter = adapter_for(model, spec)
            value = measure_reference_error(adapter)  # None in float32
            if value is not None:
                if value > worst["vs_float32"][0]:
                    worst["vs_float32"] = (value, spec)
            context = RunContext(
                tolerance=UNIT,
                dtype=adapter.capabilities.dtype,
                units=adapter.capabilities.output_kind.units,
                examples=args.examples,
            )
            behaviours = set(NOT_NOISE)
            if not adapter.capabilities.output_kind.per_position and measure_pooling(adapter, context).ids_decide:
                behaviours.add("pad_ids")  # other ids in padded slots move its pooled position: measured, not noise
            for suite in suites:
                if suite.not_applicable(adapter.capabilities):
                    continue
                for check in suite.checks(adapter, context):
                    if not isinstance(check, Check) or check.name in behaviours:
                        continue
                    kind = "shape_change" if check.name in SHAPE_CHANGING else "same_shape"
                    value = measure(check, args.examples)
                    if value > worst[kind][0]:
                        worst[kind] = (value, f"{spec} {suite.name}/{check.name}")
        for kind in ("same_shape", "shape_change", "vs_float32"):
            if kind not in worst:
                continue
            value, where = worst[kind]
            print(f"{str(dtype).removeprefix('torch.'):<10} {kind:<14} {value:>18.2f}  {where}", flush=True)


if __name__ == "__main__":
    main()
