"""Audits: running suites against a model, and the audits of what feeds a model.

- :mod:`.runner`: ``audit()``: load the model, gate batching, run each suite, write the report
- :mod:`.config`: ``[tool.maskcheck]`` settings; :mod:`.findings`: known findings and conventions
- :mod:`.collator_audit`: data collators, through the collator suite
- :mod:`.grad_accumulation`: a gradient-accumulation loop against the whole batch
- :mod:`.costs`: latency, KV-cache bytes and peak memory over context length
"""
