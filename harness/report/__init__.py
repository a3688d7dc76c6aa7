"""What a person or a later run reads of an audit.

- :mod:`.render`: the CLI's verdict table, report.md, and atomic JSON writing
- :mod:`.picture`: effective-mask pictures
- :mod:`.reproduction`: reproduction bundles, written and replayed (``maskcheck replay``)

It sits above the engine and below the suites' runner: suites may write through it,
and it finds suites only through the registry.
"""
