"""The suites for one model, inside your own test module, in one line."""

from models import decoder

from maskcheck import maskcheck_tests

test_decoder_cache_and_packing = maskcheck_tests(decoder, suites=["kv_cache", "packing"], name="gqa-decoder")


def test_the_adapter_fixture(maskcheck_adapter):
    """maskcheck_adapter: one test per configured model, each adapter built once per session."""
    assert maskcheck_adapter.capabilities.vocab_size > 0
