"""A leak canary for a whole training pipeline: data on which no leak-free pipeline can
beat a known loss.

The unit suites test the model, and the collator and accumulation audits one piece each.
A training run has more places to leak: the user's own step, a trainer's packing, a
kernel used only in training. The canary feeds the pipeline synthetic data whose best
possible loss without a leak is known exactly, and on which a leak of the answer lets the
loss go below it:

- ``uniform``: every token i.i.d. uniform over ``ids`` token ids. Each scored target is
  independent of everything a leak-free model may see, so no model beats ``log(ids)``
  nats in expectation. Position t seeing token t + 1 (a causal mask off by one, unshifted
  labels, decoder inputs that are the labels, a step that scores its inputs) drives the
  loss far below it.
- ``twin_documents``: each row packs one random document twice, as two documents
  (position ids restart at the second, the padding-free convention). A pipeline that
  isolates packed documents cannot use the first copy to predict the second; one that
  attends across them copies it.
- ``twin_rows``: rows in pairs, the second a copy of the first: rows that read each other
  (batch composition) copy.

What is measured is the pipeline's own loss on each fresh batch, before the update it
drives: a held-out estimate, so a leak that lives only in the training code shows. Each
loss's expectation is at least the bound for a leak-free pipeline, however far it has
trained. The decision is a one-sided test on windows of ``window`` steps: the window's
mean below the bound by more than ``z * sd / sqrt(window)`` (``sd`` the window's own
spread of batch losses, ``z`` the normal quantile of ``alpha / windows``, Bonferroni over
the windows), at a false-alarm rate of at most ``alpha`` per canary. Where the step also
returns its logits, maskcheck's own cross-entropy of them (shifted, -100 ignored) is the
reference: a pipeline loss below the bound that the reference does not share is a
normaliser error, not a leak, and is reported as such.

What it cannot see: a leak that does not help prediction on random data (a mask that
lets a position read padding, or a later position that carries no information about the
target), and leaks smaller than the test's resolution in the steps given. The unit suites
localise a leak the canary reports.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100
CANARIES = ("uniform", "twin_documents", "twin_rows")
#: nats above the bound a clean pipeline's last window may end and still have learnt the
#: canary's distribution: a pipeline further above has not trained enough to show a leak
UNTRAINED_SLACK = 0.1
#: which unit suite localises what each canary sees
NEXT_SUITE = {
    "uniform": "causal (a position reads later tokens) or loss_masking (the labels are not shifted)",
    "twin_documents": "packing (packed documents read each other)",
    "twin_rows": "padding/batch_composition (rows read each other)",
}
Batch = dict[str, Tensor]
#: a training step: takes a batch, updates the model, returns the loss it computed before
#: the update (a tensor or float), or (loss, logits [B, T, V]) for the reference loss
Step = Callable[[Batch], Any]


@dataclass(frozen=True)
class CanarySettings:
    """The sizes a canary runs at; the defaults fire on every seeded pipeline bug of the
    catalogue within their steps and cost seconds on a tiny model (docs/canary.md)."""

    ids: int = 16  # token ids drawn, from first_id on: the bound is log(ids)
    first_id: int = 3  # below it: the ids a tokenizer keeps for pad, BOS, EOS
    length: int = 32  # tokens a row (twin_documents: two documents of length // 2)
    batch: int = 8  # rows a batch (twin_rows: pairs)
    steps: int = 300
    window: int = 50  # steps a test covers; steps // window tests in all
    alpha: float = 1e-3  # false-alarm rate per canary


@dataclass
class CanaryResult:
    canary: str
    status: str  # "pass", "fail" (a leak) or "warn" (below the bound in the pipeline's loss only)
    bound: float  # nats
    losses: list[float]  # the pipeline's loss on each step, before its update
    references: list[float] = field(default_factory=list)  # maskcheck's cross-entropy, where logits came back
    #: the same against labels[t] unshifted: below the bound, the loss scores what the model sees
    unshifted: list[float] = field(default_factory=list)
    fired_at: int | None = None  # the last step of the window that fired
    below: float = 0.0  # nats the firing window's mean lies below the bound
    margin: float = 0.0  # nats below the bound the test needed
    message: str = ""
    label: str = ""  # the pipeline's name, for a picture of several
    notes: list[str] = field(default_factory=list)  # what the canary measured about the pipeline on the way

    def to_dict(self) -> dict[str, Any]:
        return {
            "canary": self.canary,
            "status": self.status,
            "bound": self.bound,
            "fired_at": self.fired_at,
            "below": self.below,
            "margin": self.margin,
            "message": self.message,
            "notes": self.notes,
            "losses": self.losses,
            "references": self.references,
        }


class CanaryError(Exception):
    """A pipeline the canary cannot run (its step raised, returned no loss); one line."""


def canary_batches(canary: str, settings: CanarySettings, seed: int) -> Iterator[Batch]:
    """Fresh batches for ``canary``, ``settings.steps`` of them, from ``seed``.

    Every batch has ``input_ids``, ``attention_mask`` (ones), ``labels`` (the input ids, as
    collators build them: the model or step shifts), and ``position_ids`` restarting at each
    packed document (``twin_documents``; ``0 .. T-1`` otherwise)."""
    if canary not in CANARIES:
        raise ValueError(f"unknown canary {canary!r}; choose one of {', '.join(CANARIES)}")
    generator = torch.Generator().manual_seed(seed)
    rows, length = settings.batch, settings.length
    for _ in range(settings.steps):
        draw = torch.randint(settings.first_id, settings.first_id + settings.ids, (rows, length), generator=generator)
        positions = torch.arange(length).expand(rows, -1)  # [B, T]
        if canary == "twin_documents":
            half = length // 2
            draw = torch.cat([draw[:, :half], draw[:, :half]], dim=1)  # [B, 2 * half]: a document, then itself
            positions = torch.cat([torch.arange(half), torch.arange(half)]).expand(rows, -1)
        elif canary == "twin_rows":
            draw = draw[torch.arange(rows) // 2 * 2]  # rows 2j and 2j + 1 are the same row
        yield {
            "input_ids": draw,
            "attention_mask": torch.ones_like(draw),
            "labels": draw.clone(),
            "position_ids": positions.contiguous(),
        }


def logits_of(outputs: Any) -> Tensor | None:
    """The logits a forward returned: ``.logits``, a ``"logits"`` key, the first of a tuple,
    or the tensor itself (a plain module that returns its logits)."""
    if isinstance(outputs, Tensor):
        return outputs
    logits = getattr(outputs, "logits", None)
    if logits is None and isinstance(outputs, dict):
        logits = outputs.get("logits")
    if logits is None and isinstance(outputs, tuple | list):
        logits = outputs[0]
    return logits


def reference_loss(logits: Tensor, labels: Tensor, shift: bool = True, scored: Tensor | None = None) -> float:
    """Cross-entropy of ``logits[t]`` against ``labels[t + 1]`` (``shift=False``: ``labels[t]``),
    -100 ignored, mean over targets; with ``scored`` (``[B, T]`` bool over the label
    positions), over those targets alone (NaN where there are none)."""
    if scored is not None:
        labels = labels.masked_fill(~scored.to(labels.device), IGNORE_INDEX)
    targets = (labels[:, 1:] if shift else labels).reshape(-1)
    if not (targets != IGNORE_INDEX).any():
        return math.nan
    scores = (logits[:, :-1] if shift else logits).reshape(-1, logits.shape[-1]).float()
    return float(F.cross_entropy(scores, targets.to(scores.device), ignore_index=IGNORE_INDEX))


def decide(losses: list[float], bound: float, settings: CanarySettings) -> tuple[int | None, float, float]:
    """(the last step of the first window whose mean is significantly below ``bound``, or
    None; how far below it lies; the margin the test needed), on windows of the losses
    (a NaN, a step with nothing to score, is left out of its window)."""
    windows = max(1, len(losses) // settings.window)
    z = NormalDist().inv_cdf(1 - settings.alpha / windows)
    closest: tuple[float, float] | None = None  # (below, margin) of the window nearest to firing
    for w in range(windows):
        chunk = [x for x in losses[w * settings.window : (w + 1) * settings.window] if not math.isnan(x)]
        if len(chunk) < 2:
            continue
        mean = sum(chunk) / len(chunk)
        sd = math.sqrt(sum((x - mean) ** 2 for x in chunk) / (len(chunk) - 1))
        margin = z * sd / math.sqrt(len(chunk))
        if bound - mean > margin:
            return (w + 1) * settings.window - 1, bound - mean, margin
        if closest is None or bound - mean - margin > closest[0] - closest[1]:
            closest = (bound - mean, margin)
    below, margin = closest or (0.0, 0.0)
    return None, below, margin


def run_canary(
    step: Step, canary: str = "uniform", settings: CanarySettings | None = None, seed: int = 0
) -> CanaryResult:
    """Train the pipeline behind ``step`` on ``canary``'s batches and decide whether its loss
    goes below what any leak-free pipeline can reach."""
    settings = settings or CanarySettings()
    bound = math.log(settings.ids)
    losses: list[float] = []
    references: list[float] = []
    unshifted: list[float] = []
    for index, batch in enumerate(canary_batches(canary, settings, seed)):
        try:
            returned = step(batch)
        except Exception as exc:  # noqa: BLE001 - the user's step: one line, never a traceback
            raise CanaryError(f"the training step raised at step {index}: {type(exc).__name__}: {exc}") from exc
        loss, logits = returned if isinstance(returned, tuple) else (returned, None)
        try:
            losses.append(float(loss))
        except (TypeError, ValueError) as exc:
            raise CanaryError(f"the training step returned {type(loss).__name__}, not a loss") from exc
        if logits is not None:
            references.append(reference_loss(logits.detach(), batch["labels"]))
            unshifted.append(reference_loss(logits.detach(), batch["labels"], shift=False))
    return judged(canary, bound, losses, settings, references, unshifted)


def judged(
    canary: str,
    bound: float,
    losses: list[float],
    settings: CanarySettings,
    references: list[float] | None = None,
    unshifted: list[float] | None = None,
) -> CanaryResult:
    references, unshifted = references or [], unshifted or []
    result = CanaryResult(canary, "pass", bound, losses, references, unshifted=unshifted)
    fired, below, margin = decide(losses, bound, settings)
    result.below, result.margin = below, margin
    steps = f"{len(losses)} steps of {settings.batch} x {settings.length} tokens"
    if fired is None:
        result.message = (
            f"the pipeline's loss stays at or above the bound of {bound:.3f} nats (log {settings.ids}) over {steps}: "
            f"the window nearest to firing averages {bound - below:.3f}, where the test needs {bound - margin:.3f} "
            f"or less (alpha {settings.alpha:g})"
        )
        last = [x for x in losses[-settings.window :] if not math.isnan(x)]
        above = sum(last) / len(last) - bound if last else math.inf
        if above > UNTRAINED_SLACK:
            result.status = "warn"
            result.message = (
                f"inconclusive: {result.message}; but its last {len(last)} steps average {above:.3f} nats above the "
                f"bound: it has not learnt even how often each of the canary's ids occurs, so it could not have "
                "learnt a leak in these steps either (more steps, or a larger learning rate)"
            )
        return result
    result.fired_at = fired
    window = losses[fired + 1 - settings.window : fired + 1]
    measured = (
        f"the {canary} canary fired at step {fired}: the pipeline's loss averages {sum(window) / len(window):.3f} "
        f"nats over steps {fired + 1 - settings.window}-{fired}, {below:.3g} below the bound of {bound:.3f} "
        f"(log {settings.ids}) that no leak-free pipeline beats in expectation (test margin {margin:.3g}, "
        f"alpha {settings.alpha:g})"
    )
    next_suite = NEXT_SUITE[canary]
    if references:
        shifted_mean, shifted_fired = window_verdict(references, fired, bound, settings)
        unshifted_mean, unshifted_fired = window_verdict(unshifted, fired, bound, settings)
        if shifted_fired:
            measured += (
                f"; maskcheck's cross-entropy of the same logits against the next tokens agrees ({shifted_mean:.3f})"
            )
        elif unshifted_fired:
            measured += (
                f"; maskcheck's cross-entropy of the same logits against the next tokens stays above the bound "
                f"({shifted_mean:.3f}), against each position's own token it is {unshifted_mean:.3f}: the loss scores "
                "a target the model reads at its own position (labels not shifted)"
            )
            next_suite = "loss_masking/reference_loss (the labels are not shifted)"
        else:
            result.status = "warn"
            result.message = (
                f"{measured}; maskcheck's cross-entropy of the same logits and labels stays at or above the bound "
                f"({shifted_mean:.3f}): the pipeline's loss is normalised or computed wrongly "
                "(loss_masking/reference_loss), not a leak of the answer"
            )
            return result
    result.status = "fail"
    result.message = f"{measured}: the pipeline sees the answer. Localise it with {next_suite}"
    return result


def window_verdict(values: list[float], fired: int, bound: float, settings: CanarySettings) -> tuple[float, bool]:
    """The mean of ``values`` over the window that fired, and whether it is itself below the bound."""
    window = [x for x in values[fired + 1 - settings.window : fired + 1] if not math.isnan(x)]
    if not window:
        return math.nan, False
    verdict, *_ = decide(window, bound, CanarySettings(window=len(window), alpha=settings.alpha))
    return sum(window) / len(window), verdict is not None


def draw_losses(results: list[CanaryResult], path: Any, title: str) -> Any:
    """A PNG of each canary's loss per step (and maskcheck's reference) against its bound."""
    from pathlib import Path

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure, axis = plt.subplots(figsize=(8, 4.2), constrained_layout=True)
    for result in results:
        (line,) = axis.plot(result.losses, linewidth=1, label=f"{result.label or result.canary}: {result.status}")
        if result.fired_at is not None:
            axis.axvline(result.fired_at, color=line.get_color(), linestyle=":", linewidth=1)
    bounds = sorted({round(r.bound, 6) for r in results})
    for bound in bounds:
        axis.axhline(
            bound, color="black", linestyle="--", linewidth=1, label=f"bound log {round(math.exp(bound))} = {bound:.3f}"
        )
    axis.set_xlabel("step (the loss of each fresh batch, before its update)")
    axis.set_ylabel("pipeline loss (nats)")
    axis.set_title(title)
    axis.legend(fontsize=8)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
