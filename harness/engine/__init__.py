"""The engine: how a check draws cases, runs them and decides a verdict.

- :mod:`.suite`: what a suite and a check are, and the check runner (Hypothesis search, memo, shrinking)
- :mod:`.cases`: the comparisons the suites share (same-shape perturbations, padded vs unpadded)
- :mod:`.batching`: evaluations that ask for logits, and stacking the forwards of several cases
- :mod:`.tolerance`: thresholds from measured noise floors
- :mod:`.influence`: which inputs move which outputs (for causal, padding and pictures)
- :mod:`.strategies`: the Hypothesis strategies that draw case structure
- :mod:`.profiles`: the quick, dev, ci and thorough profiles; Hypothesis settings
- :mod:`.registry`: suites and probes found through their entry-point groups
- :mod:`.verdict`: statuses, check and suite results

It imports the adapter protocol and nothing above it: no suite, report, CLI or plugin.
"""
