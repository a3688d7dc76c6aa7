"""The backward calls of an adapter: gradients a training step and a loss send to the inputs.

Mixed into ``base.Adapter``, whose ``model``, ``path``, ``capabilities``, ``_logits``,
``_loss`` and ``_check_eval`` they use. Each call runs the model as the training forward
runs it (``paths.training_forward``) or in eval mode with autograd on, and measures a
gradient's norm per position: what the gradient checks protect is where a gradient
reaches, an exact zero where a mask holds.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from .errors import AdapterError, check_logits
from .paths import note_call, trainable_copy, training_forward


class GradientCalls:
    """:meth:`input_gradients` and :meth:`loss_logit_gradients`, and the modules they hook.
    ``batch`` is a ``base.Batch`` (typed ``Any`` here: base imports this module)."""

    model: Any
    path: Any
    capabilities: Any
    _logits: Any
    _loss: Any
    _check_eval: Any
    _probe_batch: Any

    def embedding_module(self) -> Any:
        """The module whose output is the token embeddings, for :meth:`input_gradients`: the one
        a model names in ``maskcheck_embedding`` (an attribute path or the module), else the one
        measured to embed the ids (:func:`measure_embedding`: the first module to return
        ``[B, T, D]`` floats from the ids it is given, whatever its class: TransformerLens's
        ``Embed`` holds its own ``W_E``; T5's token classifier calls ``encoder.embed_tokens``,
        not the ``shared`` that ``get_input_embeddings()`` names), else
        :meth:`_unmeasured_embedding`; None when there is none."""
        if not isinstance(self.model, torch.nn.Module):
            return None
        declared = self._declared_module("maskcheck_embedding")
        if declared is not None:
            return declared
        measured = self._measured_embedding()
        if measured is not None:
            return self.model.get_submodule(measured)
        return self._unmeasured_embedding()

    def _unmeasured_embedding(self) -> Any:
        """Where no module is measured to embed the ids (the model raised): its first ``nn.Embedding``."""
        return next((m for m in self.model.modules() if isinstance(m, torch.nn.Embedding)), None)

    def _measured_embedding(self) -> str | None:
        """:func:`measure_embedding`'s answer for this adapter's model, measured once per model
        (a copy of the adapter on another model measures again)."""
        model_id, name = getattr(self, "_embedding_measured", (None, None))
        if model_id != id(self.model):
            vocab = self.capabilities.vocab_size
            ids = torch.tensor([[5, 9, 3, 7, 11, 4]], device=self.capabilities.device) % max(vocab - 1, 1) + 1
            probe = self._probe_batch(ids)
            name = measure_embedding(self.model, lambda: self._logits(probe), ids)
            self._embedding_measured = (id(self.model), name)
        return name

    def _declared_module(self, attribute: str) -> Any:
        """The submodule the model names in ``attribute`` (an attribute path or the module), or None."""
        declared = getattr(self.model, attribute, None)
        if isinstance(declared, str):
            declared = self.model.get_submodule(declared)
        return declared if isinstance(declared, torch.nn.Module) else None

    def input_gradients(self, batch: Any, outputs: Tensor, seed: int) -> tuple[Tensor, Tensor]:
        """The backward of a training step, measured: ``[B, T]`` float64, the norm at each
        predicted-side position's token embedding of the gradient of ``sum over outputs
        [B, T] (True: included) of log_softmax(logits) . u`` (``u [V]`` a random direction
        from ``seed``; the outputs themselves for an output compared raw, outputs.py), and the
        ``[B, T, V]`` logits. Run as :func:`training_forward` runs the
        model. The embeddings are the output of :meth:`embedding_module`, replaced by a leaf
        that records gradients; called more than once (an encoder-decoder's shared
        embedding), the last call of the predicted side's shape is the one measured."""
        embedding = self.embedding_module()
        if embedding is None:
            raise NotImplementedError(
                "no token embedding to differentiate: the model has no nn.Embedding (name one in maskcheck_embedding)"
            )
        self._check_eval()
        note_call(self.path, batch, self.capabilities.position_offset)
        ids = batch.predicted_ids
        # (leaf, whether the embedding was given the ids [T, B], whether it was given them
        # lengthened on the right: [B, T' > T] starting with them)
        captured: list[tuple[Tensor, bool, bool]] = []

        def keep(_module: Any, inputs: Any, output: Any) -> Any:
            # A quantized embedding returns (embeddings, scaling factor) (I-BERT's QuantEmbedding).
            rest = output[1:] if isinstance(output, tuple) and output and isinstance(output[0], Tensor) else None
            embedded = output[0] if rest is not None else output
            if not isinstance(embedded, Tensor):
                return output
            leaf = embedded.detach().requires_grad_(True)
            given = inputs[0].to(ids.device) if inputs and isinstance(inputs[0], Tensor) else None
            # Seq-first models (XLNet) transpose the ids before embedding them, and a model may
            # pad them on the right first (Longformer, to a multiple of its attention window):
            # measured on the ids the embedding was given, not guessed from shapes (torch.equal
            # is False for tensors of other shapes).
            seq_first = given is not None and torch.equal(given, ids.t()) and not torch.equal(given, ids)
            lengthened = (
                given is not None
                and given.dim() == 2
                and given.shape[0] == ids.shape[0]
                and given.shape[1] > ids.shape[1]
                and torch.equal(given[:, : ids.shape[1]], ids)
            )
            captured.append((leaf, seq_first, lengthened))
            # A copy, not the leaf: a model may scale its embeddings in place (CTRL's
            # ``inputs_embeds *= sqrt(d)``), which autograd refuses on a leaf; the gradient
            # at the leaf is the copy's.
            return leaf.clone() if rest is None else (leaf.clone(), *rest)

        handle = embedding.register_forward_hook(keep)
        try:
            with training_forward(self.model):
                logits = check_logits(
                    self._logits(trainable_copy(batch)), ids.shape[0], ids.shape[1], self.capabilities.output_width
                )
                leaves = [
                    (leaf, seq_first)
                    for leaf, seq_first, lengthened in captured
                    if lengthened
                    or tuple(leaf.shape[:2]) == (tuple(ids.shape[::-1]) if seq_first else tuple(ids.shape))
                ]
                if not leaves:
                    raise AdapterError(
                        f"the embedding module returned no [B, T, D] output for the {list(ids.shape)} ids it was given"
                    )
                direction = torch.randn(
                    logits.shape[-1], generator=torch.Generator().manual_seed(seed), dtype=torch.float64
                ).to(logits.device)
                # Indexed, not weighted: 0 x NaN at an excluded position (a fully masked row) is NaN.
                selected = logits[outputs.to(device=logits.device, dtype=torch.bool).clone()].double()  # [N, V]
                if self.capabilities.output_kind.log_probabilities:
                    selected = torch.log_softmax(selected, -1)
                objective = (selected @ direction).sum()
                leaf, seq_first = leaves[-1]
                (gradient,) = torch.autograd.grad(objective, leaf, allow_unused=True)
        finally:
            handle.remove()
        if gradient is None:
            return torch.zeros(ids.shape, dtype=torch.float64), logits.detach()
        norms = gradient.detach().double().norm(dim=-1).cpu()  # [B, T] ([B, T' > T] lengthened), or [T, B] seq-first
        return (norms.t() if seq_first else norms[:, : ids.shape[1]]), logits.detach()

    def logits_module(self) -> Any:
        """The module whose output is the logits, for :meth:`loss_logit_gradients`: the one a
        model names in ``maskcheck_logits``, else its output embeddings
        (``get_output_embeddings()``), else its last ``nn.Linear`` onto the vocabulary (onto a
        tagger's labels: the output's width); None when there is none."""
        if not isinstance(self.model, torch.nn.Module):
            return None
        declared = self._declared_module("maskcheck_logits")
        if declared is not None:
            return declared
        output = getattr(self.model, "get_output_embeddings", None)
        head = output() if callable(output) else None
        if isinstance(head, torch.nn.Module):
            return head
        width = self.capabilities.output_width  # the vocabulary, or a tagger's labels
        heads = [m for m in self.model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == width]
        return heads[-1] if heads else None

    def loss_logit_gradients(self, batch: Any, labels: Tensor) -> Tensor:
        """``[B, T]`` float64: at each predicted position, the norm of the gradient of the
        model's own loss (unshifted ``labels``, -100 ignored) with respect to that position's
        logits. The logits are the output of :meth:`logits_module`, replaced by a leaf that
        records gradients (its last call of the logits' shape, ``[B, T, V]``); the model runs
        in eval mode with autograd on. A loss that does not read a position's logits has an
        exact zero there, whatever the logits' values."""
        head = self.logits_module()
        if head is None:
            raise NotImplementedError(
                "no module whose output is the logits: the model has no output embeddings and no nn.Linear onto "
                "its vocabulary (name one in maskcheck_logits)"
            )
        self._check_eval()
        ids = batch.predicted_ids
        captured: list[Tensor] = []

        def keep(_module: Any, _inputs: Any, output: Any) -> Any:
            if not isinstance(output, Tensor) or tuple(output.shape[:2]) != tuple(ids.shape):
                return output
            leaf = output.detach().requires_grad_(True)
            captured.append(leaf)
            # A copy, not the leaf: a model may scale its logits in place (soft-capping).
            return leaf.clone()

        handle = head.register_forward_hook(keep)
        try:
            with torch.inference_mode(False), torch.enable_grad():
                loss = self._loss(trainable_copy(batch), labels.clone())
                if not captured:
                    raise AdapterError(
                        f"the logits module {type(head).__name__} returned no [B, T, V] output for the "
                        f"{list(ids.shape)} ids it was given (a loss that never computes every position's logits)"
                    )
                if not isinstance(loss, Tensor) or not loss.requires_grad:
                    raise AdapterError("the model's loss does not depend on its logits (it is computed without them)")
                (gradient,) = torch.autograd.grad(loss.reshape(()), captured[-1], allow_unused=True)
        finally:
            handle.remove()
        if gradient is None:
            return torch.zeros(ids.shape, dtype=torch.float64)
        return gradient.detach().double().norm(dim=-1).cpu()  # [B, T]


def measure_embedding(model: torch.nn.Module, call: Any, ids: Tensor) -> str | None:
    """The name of the first module of ``model`` to return ``[B, T, D]`` floats (or a tuple
    starting with them) from an input equal to ``ids [B, T]`` (as given, transposed, or
    lengthened on the right), when ``call()`` runs the model on them; None when no module
    does or the call raises. Forward hooks fire as modules return, so an embedding inside a
    model that takes the ids too is found before the model."""
    names = {module: name for name, module in model.named_modules() if name}
    found: list[str] = []

    def given_ids(value: Any) -> bool:
        if not isinstance(value, Tensor) or value.is_floating_point() or value.dim() != 2:
            return False
        value = value.to(ids.device)
        lengthened = value.shape[0] == ids.shape[0] and value.shape[1] >= ids.shape[1]
        return torch.equal(value.t(), ids) or (lengthened and torch.equal(value[:, : ids.shape[1]], ids))

    def hook(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        embedded = output[0] if isinstance(output, tuple) and output else output
        if found or not isinstance(embedded, Tensor) or not embedded.is_floating_point() or embedded.dim() != 3:
            return
        if any(given_ids(value) for value in (*args, *kwargs.values())):
            found.append(names[module])

    handles = [module.register_forward_hook(hook, with_kwargs=True) for module in names]
    try:
        with torch.inference_mode():
            call()
    except Exception:  # noqa: BLE001 - a model that raises here raises in the suites, with its message
        return None
    finally:
        for handle in handles:
            handle.remove()
    return found[0] if found else None
