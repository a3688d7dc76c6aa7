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

    def to_dict(self) -> dict[str, Any]:
        return {
            "canary": self.canary,
            "status": self.status,
            "bound": self.bound,
            "fired_at": self.fired_at,
            "below": self.below,
            "margin": self.margin,
            "message": self.message,
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


def reference_loss(logits: Tensor, labels: Tensor, shift: bool = True) -> float:
    """Cross-entropy of ``logits[t]`` against ``labels[t + 1]`` (``shift=False``: ``labels[t]``),
    -100 ignored, mean over targets."""
    targets = (labels[:, 1:] if shift else labels).reshape(-1)
    scores = (logits[:, :-1] if shift else logits).reshape(-1, logits.shape[-1]).float()
    return float(F.cross_entropy(scores, targets.to(scores.device), ignore_index=IGNORE_INDEX))


def decide(losses: list[float], bound: float, settings: CanarySettings) -> tuple[int | None, float, float]:
    """(the last step of the first window whose mean is significantly below ``bound``, or
    None; how far below it lies; the margin the test needed), on windows of the losses."""
    windows = max(1, len(losses) // settings.window)
    z = NormalDist().inv_cdf(1 - settings.alpha / windows)
    closest: tuple[float, float] | None = None  # (below, margin) of the window nearest to firing
    for w in range(windows):
        chunk = losses[w * settings.window : (w + 1) * settings.window]
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
    window = values[fired + 1 - settings.window : fired + 1]
    verdict, *_ = decide(window, bound, CanarySettings(window=len(window), alpha=settings.alpha))
    return sum(window) / len(window), verdict is not None


# -- pipelines the canary runs ----------------------------------------------------------------


def model_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    loss: Callable[[Tensor, Tensor], Tensor] | None = None,
    inputs: Callable[[Batch], dict[str, Any]] | None = None,
) -> Step:
    """The textbook step for ``model``: ``inputs(batch)`` as its keywords (default: a Hugging
    Face causal LM's, ``input_ids``, ``attention_mask``, ``labels``), its own loss (or
    ``loss(logits, labels)``), backward, an AdamW step (or ``optimizer``'s). Returns the loss
    and the logits, so the reference loss is computed too."""
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=3e-3)
    keywords = inputs or (
        lambda b: {"input_ids": b["input_ids"], "attention_mask": b["attention_mask"], "labels": b["labels"]}
    )

    def step(batch: Batch) -> tuple[Tensor, Tensor]:
        model.train()
        output = model(**keywords(batch))
        logits = output.logits if hasattr(output, "logits") else (output[0] if isinstance(output, tuple) else output)
        value = loss(logits, batch["labels"]) if loss is not None else output.loss
        optimizer.zero_grad()
        value.backward()
        optimizer.step()
        return value.detach(), logits.detach()

    return step


def trainer_canary(
    trainer: Any, canary: str = "uniform", settings: CanarySettings | None = None, seed: int = 0
) -> CanaryResult:
    """Run a transformers ``Trainer`` as it is configured (its model, optimiser settings and
    collator) on the canary's examples, one fresh batch a step, and judge the loss it logs
    each step (the training loss of that step's batch, before its update)."""
    from transformers import TrainerCallback

    settings = settings or CanarySettings()
    if canary == "twin_rows":
        raise CanaryError(
            "a Trainer shuffles its examples, so twin rows would not share a batch: run uniform or twin_documents"
        )
    examples = [
        {key: batch[key][row] for key in ("input_ids", "attention_mask", "labels")}
        for batch in canary_batches(canary, settings, seed)
        for row in range(settings.batch)
    ]
    losses: list[float] = []
    references: list[float] = []
    unshifted: list[float] = []
    compute_loss = trainer.compute_loss

    def recorded_loss(model: Any, inputs: dict[str, Any], return_outputs: bool = False, **kwargs: Any) -> Any:
        """The trainer's own loss, and beside it maskcheck's cross-entropy of the same logits."""
        loss, outputs = compute_loss(model, inputs, return_outputs=True, **kwargs)
        logits = getattr(outputs, "logits", None)
        if logits is None and isinstance(outputs, dict):
            logits = outputs.get("logits")
        if isinstance(logits, Tensor) and "labels" in inputs:
            references.append(reference_loss(logits.detach(), inputs["labels"]))
            unshifted.append(reference_loss(logits.detach(), inputs["labels"], shift=False))
        return (loss, outputs) if return_outputs else loss

    class Losses(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

    args = trainer.args
    for name, value in {
        "per_device_train_batch_size": settings.batch,
        "max_steps": settings.steps,
        "logging_steps": 1,
        "gradient_accumulation_steps": 1,
        "report_to": [],
        "save_strategy": "no",
        "dataloader_drop_last": True,
    }.items():
        setattr(args, name, value)
    trainer.train_dataset = examples
    trainer.add_callback(Losses())
    trainer.args.seed = seed
    own = trainer.__dict__.get("compute_loss")  # a compute_loss set on the instance stays the user's
    trainer.compute_loss = recorded_loss
    try:
        trainer.train()
    except Exception as exc:  # noqa: BLE001 - the user's trainer: one line
        raise CanaryError(f"the trainer raised: {type(exc).__name__}: {exc}") from exc
    finally:
        if own is None:
            del trainer.compute_loss  # the class's own again
        else:
            trainer.compute_loss = own
    complete = len(references) == len(losses)  # one loss computed per logged step: the reference pairs with it
    return judged(
        canary, math.log(settings.ids), losses, settings, references if complete else [], unshifted if complete else []
    )


# -- what users hand the canary ---------------------------------------------------------------


def resolve_pipeline(pipeline: Any, default_canary: str = "uniform") -> tuple[Callable[..., CanaryResult], str]:
    """``(run, canary)`` for what a user hands over: a step function, a ``(step, canary)``
    pair, a transformers ``Trainer``, or a model (trained with :func:`model_step`); ``run``
    takes ``(canary, settings, seed)``."""
    if isinstance(pipeline, tuple) and len(pipeline) == 2 and callable(pipeline[0]):
        step, canary = pipeline
        return (lambda c, s, seed: run_canary(step, c, s, seed)), canary
    try:
        from transformers import Trainer
    except ImportError:  # pragma: no cover - transformers is a dependency
        Trainer = ()  # type: ignore[assignment,misc]
    if Trainer and isinstance(pipeline, Trainer):
        return (lambda c, s, seed: trainer_canary(pipeline, c, s, seed)), default_canary
    if isinstance(pipeline, torch.nn.Module):
        return (lambda c, s, seed: run_canary(model_step(pipeline), c, s, seed)), default_canary
    if callable(pipeline):
        return (lambda c, s, seed: run_canary(pipeline, c, s, seed)), default_canary
    raise CanaryError(
        "a canary runs a training step, a (step, canary) pair, a transformers Trainer or a model; "
        f"got {type(pipeline).__name__}"
    )


def assert_no_leak(
    pipeline: Any, canary: str | None = None, settings: CanarySettings | None = None, seed: int = 0
) -> CanaryResult:
    """For a test: run the canary on ``pipeline`` (see :func:`resolve_pipeline`) and raise
    ``AssertionError`` with the verdict when it fires; the result otherwise."""
    run, own = resolve_pipeline(pipeline)
    result = run(canary or own, settings, seed)
    if result.status != "pass":
        raise AssertionError(result.message)
    return result


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
