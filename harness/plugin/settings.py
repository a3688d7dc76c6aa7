"""The plugin's settings: one record each, and how a run reads them.

A setting is read from the command line, then ``[tool.pytest.ini_options]``, then
``[tool.maskcheck]``, then its default. :data:`SETTINGS` is the one table of them: the
options are added from it, the usage errors name it, and docs/plugin.md shows it
(:func:`markdown_table`; tests/test_plugin.py checks the page against it). Settings read
only from ``[tool.maskcheck]`` (``examples``, ``seed``, ``timeout``, ``tolerance``,
``known_findings``, ``disabled_conventions``, ``compare``, ``collators``) are read by
:func:`run_options` and the collection hooks.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from ..engine.profile_names import PROFILE_NAMES

DEFAULT_REPORT_DIR = "maskcheck-report"


@dataclass(frozen=True)
class Setting:
    """One setting, in every place it can be given."""

    name: str  # what the code reads it by: setting(config, name)
    option: str  # the command-line option
    ini: str  # the [tool.pytest.ini_options] key
    key: str  # the [tool.maskcheck] key
    help: str
    kind: Literal["value", "list", "flag"] = "value"  # list: repeatable (models); flag: on/off
    default: Any = None
    shown_default: str = "none"  # the default, as docs/plugin.md's table says it
    usage: str = ""  # the option as the table shows it, with its values
    choices: tuple[str, ...] | None = None

    @property
    def dest(self) -> str:
        return f"maskcheck_{self.name}"

    def row(self) -> str:
        """This setting's row of docs/plugin.md's table."""
        option = "`" + (self.usage or self.option).replace("|", "\\|") + "`"  # a pipe in a table cell is escaped
        ini = f"`{self.ini} = true`" if self.kind == "flag" else f"`{self.ini}`"
        if self.kind == "list":
            option, ini = f"{option} (repeatable)", f"{ini} (one per line)"
        return f"| {option} | {ini} | `{self.key}` | {self.shown_default} |"


SETTINGS = (
    Setting(
        "models", "--maskcheck-model", "maskcheck_models", "models",
        "model spec to audit; one test per suite (repeatable)",
        kind="list", default=(), usage="--maskcheck-model SPEC",
    ),
    Setting(
        "suites", "--maskcheck-suites", "maskcheck_suites", "suites",
        "comma-separated suites (default: every suite)", shown_default="every suite", usage="--maskcheck-suites a,b",
    ),
    Setting(
        "profile", "--maskcheck-profile", "maskcheck_profile", "profile",
        "quick, dev, ci or thorough (default: ci)",
        default="ci", shown_default="`ci`", usage="--maskcheck-profile quick|dev|ci|thorough", choices=PROFILE_NAMES,
    ),
    Setting(
        "device", "--maskcheck-device", "maskcheck_device", "device",
        "cpu, cuda, cuda:N or auto (default: cpu)", default="cpu", shown_default="`cpu`",
    ),
    Setting(
        "dtype", "--maskcheck-dtype", "maskcheck_dtype", "dtype",
        "float32, bfloat16 or float16 (default: the model's own)",
        shown_default="the model's own", choices=("float32", "bfloat16", "float16"),
    ),
    Setting(
        "report_dir", "--maskcheck-report-dir", "maskcheck_report_dir", "report",
        "reports and reproduction bundles (default: maskcheck-report)",
        default=DEFAULT_REPORT_DIR, shown_default=f"`{DEFAULT_REPORT_DIR}`",
    ),
    Setting(
        "threads", "--maskcheck-threads", "maskcheck_threads", "threads",
        "torch threads per test process: auto (cores / xdist workers, unless OMP_NUM_THREADS is set), keep, or N",
        default="auto", shown_default="`auto`", usage="--maskcheck-threads auto|keep|N",
    ),
    Setting(
        "paths", "--maskcheck-paths", "maskcheck_paths", "paths",
        "comma-separated call paths each check also runs on (default: every path the model can take; canonical: none)",
        shown_default="every call path the model can take (`canonical`: none)", usage="--maskcheck-paths a,b",
    ),
    Setting(
        "always", "--maskcheck-always", "maskcheck_always", "always",
        "audit the configured models even when test paths are given", kind="flag", default=False, shown_default="off",
    ),
    Setting(
        "require", "--maskcheck-require", "maskcheck_require", "require",
        "fail the run when a configured model is not audited (paths, -k/-m, interruption)",
        kind="flag", default=False, shown_default="off",
    ),
)  # fmt: skip
BY_NAME = {setting.name: setting for setting in SETTINGS}


def markdown_table() -> str:
    """docs/plugin.md's table of the settings."""
    head = "| option | `[tool.pytest.ini_options]` key | `[tool.maskcheck]` key | default |\n|---|---|---|---|"
    return "\n".join([head, *(setting.row() for setting in SETTINGS)])


def add_options(parser: pytest.Parser) -> None:
    """Each setting as a command-line option and an ini key."""
    group = parser.getgroup("maskcheck", "maskcheck: masking and caching invariance suites")
    for each in SETTINGS:
        if each.kind == "list":
            group.addoption(each.option, action="append", dest=each.dest, default=[], metavar="SPEC", help=each.help)
            parser.addini(each.ini, each.help, type="linelist", default=[])
        elif each.kind == "flag":
            group.addoption(each.option, action="store_true", dest=each.dest, default=False, help=each.help)
            parser.addini(each.ini, each.help, type="bool", default=False)
        else:
            group.addoption(each.option, dest=each.dest, default=None, help=each.help)
            parser.addini(each.ini, each.help, default=None)


def setting(config: pytest.Config, name: str) -> Any:
    """The value of one setting: command line, then ini key, then [tool.maskcheck], then the default."""
    each = BY_NAME[name]
    if each.kind == "flag":
        return bool(config.getoption(each.dest) or config.getini(each.ini) or tool_config(config).get(each.key))
    value = config.getoption(each.dest)
    if value:
        return value
    ini = config.getini(each.ini)
    if ini:
        return ini
    return tool_config(config).get(each.key, each.default)


def validate_settings(config: pytest.Config) -> None:
    """Every setting checked once, up front: one usage error instead of one per test."""
    from .threads import ThreadSettingError, parse_threads

    tool = tool_config(config)
    both = [
        f"{each.ini} in [tool.pytest.ini_options] and {each.key} in [tool.maskcheck]"
        for each in SETTINGS
        if each.key in tool and config.getini(each.ini)  # an ini default is nothing, or false
    ]
    if both:
        raise pytest.UsageError(f"maskcheck: set each setting in one place, not both: {'; '.join(both)}")
    for each in SETTINGS:
        value = setting(config, each.name) if each.choices else None
        if value is not None and value not in each.choices:  # type: ignore[operator]
            raise pytest.UsageError(f"maskcheck: {each.ini} = {value!r} is not one of {', '.join(each.choices or ())}")
    try:
        parse_threads(setting(config, "threads"))
    except ThreadSettingError as exc:
        raise pytest.UsageError(f"maskcheck: {exc}") from None
    call_paths(setting(config, "paths"))
    chosen_suites(config)


def require_applies(config: pytest.Config) -> bool:
    """Whether ``require`` may fail this run: ``--maskcheck-require`` on the command line
    always (what CI passes), else a configured ``require`` for runs meant to audit, the ones
    given no test paths or node ids, no ``-k`` and no ``-m``. ``--collect-only`` never fails
    because of it, nor does a targeted run (an IDE's, ``pytest tests/test_x.py::test_one``)."""
    if config.getoption("collectonly"):
        return False
    if config.getoption(BY_NAME["require"].dest):
        return True
    if not setting(config, "require"):
        return False
    targeted = config.args_source == pytest.Config.ArgsSource.ARGS
    return not (targeted or config.getoption("keyword") or config.getoption("markexpr"))


def collects_configured(config: pytest.Config) -> bool:
    """Whether this run collects the configured models and pairs: runs without test paths,
    and any run with ``--maskcheck-model`` or ``always``."""
    if config.getoption(BY_NAME["models"].dest) or setting(config, "always"):
        return True
    return config.args_source != pytest.Config.ArgsSource.ARGS


def tool_config(config: pytest.Config) -> dict[str, Any]:
    """``[tool.maskcheck]`` of the nearest pyproject.toml, read once per run; its warnings
    (a key this version does not know) go to pytest's warnings summary."""
    cached = config.stash.get(_CONFIG_KEY, None)
    if cached is None:
        import warnings

        from ..audits.config import ConfigError, ConfigWarning, load_config

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always", ConfigWarning)
                cached = load_config(config.rootpath)
        except ConfigError as exc:
            raise pytest.UsageError(f"maskcheck: {exc}") from None
        config.stash[_CONFIG_KEY] = cached
        for warning in caught:  # into pytest's warnings summary, where a host looks for them
            config.issue_config_time_warning(warning.message, stacklevel=2)
    return cached


_CONFIG_KEY = pytest.StashKey[dict]()
_OPTIONS_KEY = pytest.StashKey[Any]()


def models(config: pytest.Config) -> list[Any]:
    """The configured models: the settings' specs, then what hosts supply through the
    ``pytest_maskcheck_models`` hook; each once."""
    from .testing import ModelEntry

    entries = [ModelEntry.of(spec) for spec in setting(config, "models")]
    for supplied in config.hook.pytest_maskcheck_models(config=config):
        entries.extend(ModelEntry.of(value) for value in supplied or [])
    unique: dict[str, Any] = {}
    for entry in entries:
        unique.setdefault(entry.name, entry)
    return list(unique.values())


def pairs(config: pytest.Config) -> list[Any]:
    """The configured pairs to compare (``[[tool.maskcheck.compare]]``)."""
    return list(tool_config(config).get("compare", []))


def chosen_suites(config: pytest.Config) -> list[str]:
    """The suites the settings name, checked against the registered names (no suite is imported)."""
    from ..engine.registry import registered_suite_names, unknown_suites_message

    chosen = setting(config, "suites")
    if isinstance(chosen, str):
        chosen = [part.strip() for part in chosen.split(",") if part.strip()]
    message = unknown_suites_message(chosen or [], registered_suite_names())
    if message:
        raise pytest.UsageError(f"maskcheck: {message}")
    return list(chosen or [])


def suites(config: pytest.Config) -> list[str]:
    """The suites to run: those the settings name, else every registered suite in run order."""
    from ..engine.registry import suite_names

    return chosen_suites(config) or suite_names()


def gate_in_run(config: pytest.Config) -> bool:
    """Whether the suite holding the batching gate is among this run's suites."""
    from ..engine.registry import batching_gate_suite

    gate = batching_gate_suite()
    return gate is not None and gate.name in suites(config)


def run_options(config: pytest.Config) -> Any:
    """The options every maskcheck test of this run audits under, read once."""
    cached = config.stash.get(_OPTIONS_KEY, None)
    if cached is None:
        from .testing import RunOptions

        tool = tool_config(config)
        cached = RunOptions(
            profile=setting(config, "profile"),
            device=setting(config, "device"),
            dtype=setting(config, "dtype"),
            examples=tool.get("examples"),
            seed=tool.get("seed", 0),
            report_dir=Path(config.rootpath, setting(config, "report_dir")),
            timeout=tool.get("timeout"),
            known_findings=tool.get("known_findings", ()),
            disabled_conventions=tool.get("disabled_conventions", ()),
            tolerance=tool.get("tolerance"),
            threads=setting(config, "threads"),
            paths=call_paths(setting(config, "paths")),
        )
        config.stash[_OPTIONS_KEY] = cached
    return cached


def call_paths(value: Any) -> tuple[str, ...] | None:
    """``--maskcheck-paths a,b`` (or the ini key, or ``paths = [...]``) as names; None: every path.
    An unknown name is a usage error, before anything runs."""
    if value is None:
        return None
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value) if n.strip()]
    from ..adapters.paths import PATHS

    unknown = sorted(set(names) - set(PATHS))
    if unknown:
        raise pytest.UsageError(f"maskcheck: unknown call path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    return tuple(names)
