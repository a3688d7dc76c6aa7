"""Factories the configuration names. They run when the first test of the model runs,
never at collection, so every pytest-xdist worker collects the same tests cheaply."""


def decoder():
    """Your model here; a maskcheck reference decoder stands in for it."""
    import torch

    from maskcheck.reference_models import PRESETS, Transformer

    torch.manual_seed(0)
    return Transformer(PRESETS["tiny-decoder-gqa"])


def encoder_decoder():
    """A Hugging Face model works the same way (here random weights from a tiny config)."""
    from maskcheck.reference_models.hf_tiny import tiny_model

    return tiny_model("bart", "sdpa")
