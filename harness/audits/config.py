"""Configuration: ``[tool.maskcheck]`` in the nearest pyproject.toml (the command line wins).

One table serves the CLI and the pytest plugin (which also reads ``maskcheck_*`` keys in
``[tool.pytest.ini_options]``). Keys:

| key | type | meaning |
|---|---|---|
| ``models`` | list of specs | models the pytest plugin audits (``--maskcheck-model``) |
| ``suites`` | list or comma string | suites to run (default: all) |
| ``device`` | string | cpu, cuda, cuda:N or auto |
| ``dtype`` | string | float32, bfloat16 or float16 |
| ``attn_implementation`` | list or comma string | Hugging Face attention backends |
| ``task`` | string | causal-lm, masked-lm or seq2seq (``hf:`` specs) |
| ``profile`` | string | quick, dev, ci or thorough |
| ``examples`` | int | cases per check (replaces the profile's count) |
| ``paths`` | list or comma string | call paths every check also runs on (default: all the model can take) |
| ``seed`` | int | seed for case generation |
| ``report`` | path | report directory (report.json, report.md, pictures, bundles) |
| ``timeout`` | seconds | time limit per suite |
| ``tolerance`` | tables | ``[tool.maskcheck.tolerance."cpu.float32"]`` overrides |
| ``known_findings`` | array of tables | accepted findings, see :class:`KnownFinding` |
| ``always``, ``require`` | bool | the pytest plugin's ``--maskcheck-always`` and ``--maskcheck-require`` |
| ``collators`` | list | collators the pytest plugin audits: ``"pkg.mod:factory"`` (causal-lm) or ``{factory = "...", task = "packed"}`` |
| ``compare`` | array of tables | pairs the pytest plugin compares, see :class:`ComparePair` |

Every problem is a :class:`ConfigError` with a one-line message naming the file.
"""

from __future__ import annotations

import datetime
import fnmatch
import tomllib
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    pass


class ConfigWarning(UserWarning):
    """A ``[tool.maskcheck]`` key this version does not know: ignored, and said."""


#: key -> the Python type its value must have after normalisation
KEYS: dict[str, type | tuple[type, ...]] = {
    "models": list,
    "suites": list,
    "device": str,
    "dtype": str,
    "attn_implementation": list,
    "task": str,
    "profile": str,
    "examples": int,
    "paths": list,
    "seed": int,
    "report": str,
    "timeout": (int, float),
    "tolerance": dict,
    "known_findings": list,
    "collators": list,
    "compare": list,
    "disabled_conventions": list,  # ids of harness/audits/conventions.json entries to report as failures again
    "threads": (str, int),  # the pytest plugin's torch threads per process: auto, keep or N
    "always": bool,  # the pytest plugin: audit the configured models even when test paths are given
    "require": bool,  # the pytest plugin: fail a run meant to audit that leaves a configured model out
}
LIST_KEYS = ("models", "suites", "attn_implementation", "paths")


@dataclass(frozen=True)
class ComparePair:
    """Two implementations the pytest plugin compares (``maskcheck compare A B``), one test a pair::

        [[tool.maskcheck.compare]]
        a = "hf:./checkpoints/llama"
        b = "module:mypkg.port:build"
        weights = "keys.json"   # "same", a JSON file or a table of A's keys -> B's; absent: as built
        map = "modules.json"    # a JSON file or a table of A's module names -> B's; absent: order and shape
        suites = ["causal", "kv_cache"]   # absent: compare's defaults

    File paths are relative to the pyproject.toml that names them.
    """

    a: str
    b: str
    weights: str | tuple[tuple[str, str | None], ...] | None = None
    module_map: str | tuple[tuple[str, str], ...] | None = None
    suites: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        """What its test id says: ``A-vs-B``."""
        return f"{self.a}-vs-{self.b}"


@dataclass(frozen=True)
class KnownFinding:
    """A finding a project has accepted: reported as ``warn`` until it expires, then it fails again.

    ``model`` and ``check`` are shell-style patterns (``hf:*``, ``*``) matched against the
    audited spec and the check name.
    """

    model: str
    suite: str
    check: str
    reason: str
    expires: datetime.date

    def matches(self, model: str, suite: str, check: str) -> bool:
        return fnmatch.fnmatchcase(model, self.model) and suite == self.suite and fnmatch.fnmatchcase(check, self.check)


def find_pyproject(start: str | Path | None = None) -> Path | None:
    """The nearest pyproject.toml in ``start`` or a parent directory."""
    here = Path(start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(start: str | Path | None = None) -> dict[str, Any]:
    """The validated ``[tool.maskcheck]`` table, or ``{}``; lists given as comma strings are split."""
    path = find_pyproject(start)
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read [tool.maskcheck] ({exc})") from None
    table = data.get("tool", {}).get("maskcheck", {})
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.maskcheck] must be a table")
    return normalise(table, str(path))


def normalise(table: dict[str, Any], where: str) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for key, value in table.items():
        if key not in KEYS:  # written for a newer maskcheck, or a typo: said, and ignored
            warnings.warn(
                ConfigWarning(
                    f"{where}: [tool.maskcheck] key {key!r} is not known to this maskcheck and is ignored "
                    f"(known: {', '.join(KEYS)})"
                ),
                stacklevel=2,
            )
            continue
        if key in LIST_KEYS and isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        if not isinstance(value, KEYS[key]) or (isinstance(value, bool) and KEYS[key] is not bool):
            raise ConfigError(f"{where}: [tool.maskcheck] {key} has the wrong type ({type(value).__name__})")
        config[key] = value
    tolerance = config.get("tolerance", {})
    if not all(isinstance(v, dict) for v in tolerance.values()):
        raise ConfigError(f'{where}: [tool.maskcheck.tolerance] must hold tables such as ["cpu.float32"]')
    config["known_findings"] = [known_finding(entry, where) for entry in config.get("known_findings", [])]
    config["collators"] = [collator_entry(entry, where) for entry in config.get("collators", [])]
    config["compare"] = [compare_entry(entry, where) for entry in config.get("compare", [])]
    return config


def compare_entry(entry: Any, where: str) -> ComparePair:
    """One ``[[tool.maskcheck.compare]]`` table as a :class:`ComparePair`, its file paths made absolute."""
    if not isinstance(entry, dict) or not all(isinstance(entry.get(side), str) for side in ("a", "b")):
        raise ConfigError(f'{where}: each compare entry is a table with a = "SPEC" and b = "SPEC"')
    unknown = sorted(set(entry) - {"a", "b", "weights", "map", "suites"})
    if unknown:
        raise ConfigError(
            f"{where}: compare entry keys {', '.join(unknown)} are not known (a, b, weights, map, suites)"
        )
    folder = Path(where).parent

    def names(key: str) -> Any:
        value = entry.get(key)
        if value is None or (key == "weights" and value == "same"):
            return value
        if isinstance(value, str):
            return str(folder / value)
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return tuple(value.items())
        raise ConfigError(f"{where}: compare {key} is a JSON file's path or a table of names to names")

    suites = entry.get("suites", [])
    if isinstance(suites, str):
        suites = [part.strip() for part in suites.split(",") if part.strip()]
    if not isinstance(suites, list) or not all(isinstance(s, str) for s in suites):
        raise ConfigError(f"{where}: compare suites is a list of suite names")
    return ComparePair(entry["a"], entry["b"], names("weights"), names("map"), tuple(suites))


def collator_entry(entry: Any, where: str) -> tuple[str, str]:
    """``(factory, task)`` of one ``collators`` entry."""
    from ...suites.collator import TASKS

    if isinstance(entry, str):
        entry = {"factory": entry}
    if not isinstance(entry, dict) or not isinstance(entry.get("factory"), str):
        raise ConfigError(
            f'{where}: each collators entry is "pkg.mod:factory" or a table with factory = "pkg.mod:factory"'
        )
    task = entry.get("task", "causal-lm")
    if task not in TASKS:
        raise ConfigError(f"{where}: collators task {task!r} is not one of {', '.join(TASKS)}")
    return entry["factory"].removeprefix("collator:"), task


def known_finding(entry: Any, where: str) -> KnownFinding:
    if not isinstance(entry, dict):
        raise ConfigError(f"{where}: each known_findings entry must be a table")
    missing = [k for k in ("model", "suite", "check", "reason", "expires") if k not in entry]
    if missing:
        raise ConfigError(f"{where}: a known_findings entry lacks {', '.join(missing)}")
    expires = entry["expires"]
    if isinstance(expires, str):
        try:
            expires = datetime.date.fromisoformat(expires)
        except ValueError:
            raise ConfigError(f"{where}: known_findings expires {expires!r} is not a date (YYYY-MM-DD)") from None
    if not isinstance(expires, datetime.date):
        raise ConfigError(f"{where}: known_findings expires must be a date (YYYY-MM-DD)")
    return KnownFinding(str(entry["model"]), str(entry["suite"]), str(entry["check"]), str(entry["reason"]), expires)
