"""A wheel built from the repository carries every package and its data, and audits.

pyproject.toml lists the packages explicitly (the folders are mapped into the maskcheck
namespace): a sub-package left off the list would be missing from every install that is
not editable. The wheel is installed, alone, into a fresh environment whose other
packages come from this one, and the command line audits from it."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def package_folders() -> dict[str, Path]:
    """Every package in the repository (a folder with __init__.py under the mapped folders), by import name."""
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    found = {}
    for name, folder in mapping.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            relative = init.parent.relative_to(ROOT / folder)
            found[".".join([name, *relative.parts])] = init.parent
    return found


def data_packages() -> set[str]:
    """Listed packages that are folders of data alone (the shipped checkpoints): setuptools
    installs package data only from a listed package."""
    mapping = PYPROJECT["tool"]["setuptools"]["package-dir"]
    found = set()
    for name in PYPROJECT["tool"]["setuptools"]["packages"]:
        root = next((n for n in sorted(mapping, key=len, reverse=True) if name == n or name.startswith(n + ".")), None)
        if root is None:
            continue
        folder = ROOT / mapping[root] / Path(*name[len(root) :].lstrip(".").split(".")) if name != root else None
        if folder is not None and folder.is_dir() and not any(folder.glob("*.py")):
            found.add(name)
    return found


def test_pyproject_lists_every_package() -> None:
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    assert set(package_folders()) - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - set(package_folders()) - data_packages() == set(), "listed packages that do not exist"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-v",
        "--no-deps",
        "--no-build-isolation",
        str(ROOT),
        "-w",
        str(out),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    BUILD_LOG.append(done.stdout + done.stderr)
    (built,) = out.glob("maskcheck-*.whl")
    return built


BUILD_LOG: list[str] = []  # the wheel fixture's build output


def test_the_build_prints_no_setuptools_warning(wheel: Path) -> None:
    """A license table and checkpoints installed as data of an unlisted package each made
    setuptools warn (deprecations with a removal date)."""
    warned = [line.strip() for line in BUILD_LOG[0].splitlines() if "Warning" in line and "setuptools" in line]
    assert warned == [], warned


def test_the_wheel_carries_every_package_and_its_data(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for package in package_folders():
        assert f"{package.replace('.', '/')}/__init__.py" in names, package
    for data in (
        "maskcheck/harness/audits/conventions.json",
        "maskcheck/harness/report/report.schema.json",
        "maskcheck/suites/probes/words.txt",
        "maskcheck/reference_models/checkpoints/kv-retrieval.safetensors",
    ):
        assert data in names, data


def test_maskcheck_audits_from_a_wheel_install(wheel: Path, tmp_path: Path) -> None:
    """The wheel unpacked into a fresh environment's site-packages; torch and the other
    dependencies reached through a .pth file (which does not run this environment's
    editable-install hook), so maskcheck itself can only come from the wheel."""
    env = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    site = Path(sysconfig.get_path("purelib", vars={"base": str(env), "platbase": str(env)}))
    zipfile.ZipFile(wheel).extractall(site)
    dependencies = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (site / "dependencies.pth").write_text("\n".join(dependencies) + "\n")
    python = env / "bin" / "python"
    environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    where = subprocess.run(
        [str(python), "-c", "import maskcheck.harness.engine as e, importlib.metadata as m; print(e.__file__); "
         "print(m.entry_points(group='console_scripts', name='maskcheck')[0].load().__module__); "
         "print(m.entry_points(group='pytest11', name='maskcheck')[0].load().__name__)"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, env=environment,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr[-2000:]
    engine_file, script_module, plugin = where.stdout.split()
    assert Path(engine_file).is_relative_to(site), engine_file
    assert (script_module, plugin) == ("maskcheck.harness.cli.main", "maskcheck.harness.plugin")
    audit = subprocess.run(
        [str(python), "-m", "maskcheck", "audit", "ref:tiny-decoder", "--suites", "causal,kv_cache", "-q"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=environment,
    )  # fmt: skip
    assert audit.returncode == 0, audit.stdout[-2000:] + audit.stderr[-2000:]
    assert "causal" in audit.stdout and "kv_cache" in audit.stdout and "PASS" in audit.stdout
