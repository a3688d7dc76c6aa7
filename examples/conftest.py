"""Supplying a model through the plugin's hook (for models that are not importable factories)."""

from maskcheck import ModelEntry


def pytest_maskcheck_models(config):
    def sliding_window_decoder():
        import torch

        from maskcheck.reference_models import PRESETS, Transformer

        torch.manual_seed(0)
        return Transformer(PRESETS["tiny-decoder-sliding"])

    return [ModelEntry("sliding-decoder", sliding_window_decoder)]
