"""Hypothesis settings profiles for maskcheck's checks: ``quick``, ``dev``, ``ci`` and ``thorough``.

They are registered with Hypothesis when this module is imported (the engine imports it),
so any repo that runs maskcheck gets them. They are registered as ``maskcheck-dev``,
``maskcheck-ci`` and ``maskcheck-thorough``: a bare ``ci`` would replace a profile of that
name the host repo registers for its own tests. Users still type the short names:
``--profile ci``, ``--maskcheck-profile ci``.

How the knobs combine:

- the profile sets how many cases each check draws and whether the
  ``@reproduce_failure`` blob is printed;
- ``--examples N`` replaces the profile's count; a check with a small case space draws
  fewer (its own cap). Hypothesis's minimal case runs first, then the N random cases,
  up to ten to a Hypothesis example (``harness.engine.suite.split_examples``: 20 cases are 2
  examples of 10), which spreads Hypothesis's fixed cost per example over several model
  calls. A failing example shrinks as usual and the first failing case in it is the one
  reported. Checks of one suite given the same strategy object see the same cases,
  drawn once;
- ``--seed S`` (default 0) seeds Hypothesis for every check, so every profile is
  derandomized: the same spec, seed and profile draw the same cases on every machine.
  Hypothesis's own ``derandomize`` flag is not used because it ignores the seed, and
  ``--seed`` must keep its meaning under ``ci`` too. A seed alone is not enough:
  Hypothesis draws about one integer in twenty from the constants written in the
  *local* modules the process has imported (those outside site-packages), so the host
  repository's own code under the plugin, an earlier command in the same process, or an
  editable install of maskcheck would each shift the cases. maskcheck's searches run
  with that pool empty (:func:`without_local_constants`); Hypothesis's built-in
  constants still take part;
- a model forward has no deadline and no health check fires for slow data generation;
- no example database: a failure is replayed from its reproduction bundle, never from
  ``.hypothesis/``, so pytest-xdist workers never share or race on one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import HealthCheck, Verbosity, settings

from .profile_names import PROFILE_NAMES

#: ``quick`` evaluates each check's minimal case alone (the case Hypothesis tries first: one
#: short row, one chunk of one token): the cheapest audit of every suite and call path,
#: for a pre-commit hook. What it cannot see (a second row, left padding, a long row, a
#: chunk of several tokens) is measured in docs/performance.md.
PROFILES: dict[str, settings] = {
    "quick": settings(max_examples=1, print_blob=True),
    "dev": settings(max_examples=8, print_blob=False),
    "ci": settings(max_examples=10, print_blob=True),
    "thorough": settings(max_examples=200, print_blob=True),
}
COMMON = {
    "deadline": None,
    "database": None,
    "suppress_health_check": list(HealthCheck),
    "verbosity": Verbosity.quiet,
    "report_multiple_bugs": False,
}


def hypothesis_name(profile: str) -> str:
    return f"maskcheck-{profile}"


def check_profile(profile: str) -> str:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}")
    return profile


def profile_settings(profile: str) -> settings:
    """The registered Hypothesis settings of a maskcheck profile."""
    return settings.get_profile(hypothesis_name(check_profile(profile)))


def examples_of(profile: str) -> int:
    return profile_settings(profile).max_examples


#: Cases a check draws on each call path besides the canonical one (harness/adapters/paths.py):
#: ``dev`` and ``ci`` sample every path with a few, ``thorough`` gives each path its full count.
PATH_EXAMPLES = {"quick": 1, "dev": 2, "ci": 2, "thorough": None}


def path_examples_of(profile: str, examples: int) -> int:
    """Cases per check on each other call path, for a profile whose checks draw ``examples``."""
    share = PATH_EXAMPLES.get(profile)
    return examples if share is None else min(share, examples)


assert tuple(PROFILES) == PROFILE_NAMES, "a profile is named in profile_names.py and given its settings here"
for _name, _settings in PROFILES.items():
    settings.register_profile(hypothesis_name(_name), settings(_settings, **COMMON))


#: The allowed constants Hypothesis's searches computed from the empty pool, kept between
#: maskcheck's searches: every search filters the same pool the same way, and filtering it
#: again each time was the largest part of Hypothesis's own work in a tiny model's audit.
_EMPTY_POOL_ALLOWED: dict = {}


@contextmanager
def without_local_constants() -> Iterator[None]:
    """Hypothesis searches inside this block draw no constants from local modules.

    Hypothesis reads them through a private function of its providers module; it is
    swapped for one returning an empty pool only for the block. The cache of allowed
    constants holds, inside the block, only what was computed from that empty pool (kept
    between blocks), and is cleared on leaving it, so the host's own Hypothesis tests (run
    in the same process under the plugin) keep their pool. Not thread-safe: a host test
    drawing on another thread during a maskcheck search would see the empty pool too. If a
    Hypothesis release moves these internals the block does nothing, and
    ``tests/test_engine.py`` (drawn cases independent of imported modules) fails.
    """
    try:
        from hypothesis.internal.conjecture import providers

        original = providers._get_local_constants
        empty = providers.Constants()
        cache = providers.CONSTANTS_CACHE.cache
    except (ImportError, AttributeError):  # pragma: no cover - a Hypothesis without this pool
        yield
        return
    cache.clear()
    cache.update(_EMPTY_POOL_ALLOWED)
    providers._get_local_constants = lambda: empty
    try:
        yield
    finally:
        providers._get_local_constants = original
        _EMPTY_POOL_ALLOWED.clear()
        _EMPTY_POOL_ALLOWED.update(cache)
        cache.clear()


#: The longest sequence a case may have, per profile, within the model's declared context:
#: a full forward compares every position of a case at once, so long cases cost tokens, not
#: forwards. Cached decoding steps token by token, so it has a cap of its own.
LENGTH_CAPS = {"quick": 128, "dev": 128, "ci": 256, "thorough": 4096}
CACHE_LENGTH_CAPS = {"quick": 48, "dev": 48, "ci": 96, "thorough": 512}


def length_cap(profile: str, max_length: int | None, cached: bool = False) -> int | None:
    """The longest case length for ``profile`` on a model whose context is ``max_length``;
    None for a model that declares no context, which runs the short cases only (a length
    past its position table would be an error of the audit's, not the model's)."""
    if max_length is None:
        return None
    cap = (CACHE_LENGTH_CAPS if cached else LENGTH_CAPS).get(profile, LENGTH_CAPS["dev"])
    return max(1, min(cap, max_length))
