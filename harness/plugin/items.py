"""The tests the plugin generates: one suite on one model, one compared pair, one collator.
Each runs its body from :mod:`.testing`; its failure is the verdict's text."""

from __future__ import annotations

from typing import Any

import pytest

from .settings import gate_in_run, run_options


class VerdictItem(pytest.Item):
    """A generated maskcheck test: marked ``maskcheck``, and its failure is the verdict text."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_marker("maskcheck")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from .testing import MaskcheckFailure

        if isinstance(excinfo.value, MaskcheckFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)


class MaskcheckItem(VerdictItem):
    """One suite against one model."""

    def __init__(self, *, entry: Any, suite: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.entry = entry
        self.suite = suite

    def runtest(self) -> None:
        from .testing import _SESSION_CACHE, run_suite_test

        options = run_options(self.config)
        adapter = _SESSION_CACHE.get(self.entry, options)
        run_suite_test(adapter, self.suite, options, self, self.entry.slug, gate_in_run(self.config))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"maskcheck {self.suite} on {self.entry.name}"


class CompareItem(VerdictItem):
    """``maskcheck compare`` of one configured pair, every suite compared in one test."""

    def __init__(self, *, pair: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pair = pair

    def runtest(self) -> None:
        from .testing import run_compare_test

        run_compare_test(self.pair, run_options(self.config))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"maskcheck compare {self.pair.a} {self.pair.b}"


class CollatorItem(VerdictItem):
    """The collator checks of one task against one collator factory."""

    def __init__(self, *, factory: str, task: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.factory = factory
        self.task = task

    def runtest(self) -> None:
        from .testing import run_collator_test

        run_collator_test(self.factory, self.task, run_options(self.config))

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.path, None, f"maskcheck collator ({self.task}) on {self.factory}"
