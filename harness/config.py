"""``[tool.maskcheck]`` from the nearest pyproject.toml (the command line wins over it)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    pass


def find_pyproject(start: str | Path | None = None) -> Path | None:
    """The nearest pyproject.toml in ``start`` or a parent directory."""
    here = Path(start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(start: str | Path | None = None) -> dict[str, Any]:
    """The ``[tool.maskcheck]`` table, or ``{}``. A malformed file is a one-line error."""
    path = find_pyproject(start)
    if path is None:
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read [tool.maskcheck] ({exc})") from None
    config = data.get("tool", {}).get("maskcheck", {})
    tolerance = config.get("tolerance", {})
    if not isinstance(tolerance, dict) or not all(isinstance(v, dict) for v in tolerance.values()):
        raise ConfigError(f'{path}: [tool.maskcheck.tolerance] must hold tables such as ["cpu.float32"]')
    return config
