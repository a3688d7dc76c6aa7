"""Every maskcheck command the README and docs/ show (`$ maskcheck ...`) runs, offline, on a CPU,
and exits as the page says: the docs cannot rot. A command that cannot run here (an
install line, a GPU, a long benchmark, a checkpoint trained first) says so on its line:
"(not run by the docs test)"."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # subfolders too (docs/dev/)
NOT_RUN = "(not run by the docs test)"
EXIT = re.compile(r"\(exit (\d+)\)")


def documented_commands(page: Path) -> list[tuple[str, int | None]]:
    """(command, the exit code the page shows or None) for each `$ maskcheck` line, in order."""
    commands: list[tuple[str, int | None]] = []
    fenced = False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            continue
        if line.startswith("$ "):
            command = line[2:].split("  #")[0].strip()
            if NOT_RUN in line or "maskcheck " not in command or command.startswith(("pytest", "python")):
                commands.append(("", None))  # a boundary: output below belongs to no command we run
                continue
            commands.append((command, None))
        elif commands and commands[-1][0] and (found := EXIT.search(line)):
            commands[-1] = (commands[-1][0], int(found.group(1)))
    return [c for c in commands if c[0]]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """What the pages' commands expect beside them: a checkpoint directory, its export to ONNX,
    and the examples."""
    from maskcheck.reference_models.hf_tiny import tiny_model

    tiny_model("gpt2").save_pretrained(tmp_path / "my-checkpoint")
    if importlib.util.find_spec("onnxruntime") is not None:  # the dev extra: the same model, exported with its cache
        from maskcheck.reference_models.onnx_exports import export_hf

        export_hf("gpt2", tmp_path / "exports" / "model.onnx", cache=True)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    (tmp_path / "docs").mkdir()
    return tmp_path


def run(command: str, cwd: Path, path: str | None = None) -> subprocess.CompletedProcess:  # type: ignore[type-arg]
    if command.startswith("cd "):
        directory, _, command = command[3:].partition("&&")
        cwd = cwd / directory.strip()
    argv = shlex.split(command.strip())
    assert argv[0] == "maskcheck", command
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    if path is not None:
        environment["PYTHONPATH"] = os.pathsep.join(filter(None, [path, environment.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "maskcheck", *argv[1:]],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=environment,
    )


WRITING_A_SUITE = ROOT / "docs" / "writing-a-suite.md"  # its commands need its suite registered: tested below


#: pages whose commands take a minute or more: run by make test-slow
SLOW_PAGES = ("suites.md", "probes.md")


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_PAGES else p for p in PAGES if p != WRITING_A_SUITE],
    ids=[str(p.relative_to(ROOT)) for p in PAGES if p != WRITING_A_SUITE],
)
def test_every_documented_command_runs(page: Path, workdir: Path) -> None:
    for command, expected in documented_commands(page):
        completed = run(command, workdir)
        output = completed.stdout + completed.stderr
        assert "Traceback" not in output, (command, output[-2000:])
        if expected is not None:
            assert completed.returncode == expected, (command, output[-2000:])
        else:
            assert completed.returncode in (0, 1), (command, completed.returncode, output[-2000:])


def test_the_cli_reference_is_current() -> None:
    completed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "cli_reference.py"), "--check"], capture_output=True, text=True
    )
    assert completed.returncode == 0, completed.stderr


def test_no_link_leaves_the_repository() -> None:
    links = re.compile(r"\]\(([^)#]+)")
    for page in PAGES:
        for target in links.findall(page.read_text()):
            if target.startswith(("http://", "https://")):
                continue
            assert (page.parent / target).resolve().is_relative_to(ROOT), (page.name, target)
            assert (page.parent / target).exists(), (page.name, target)


def fenced_blocks(page: Path, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", page.read_text(), flags=re.S | re.M)


def test_a_newcomer_adds_a_suite_by_following_the_page(tmp_path: Path) -> None:
    """docs/writing-a-suite.md, verbatim: its module saved under the name its first line
    gives, its entry point registered as pip would (a dist-info on sys.path), then every
    command the page shows, with the exit code it shows: the suite is listed, passes a
    clean decoder, fails the seeded causal bug and does not apply to an encoder."""
    import tomllib

    (module,) = fenced_blocks(WRITING_A_SUITE, "python")
    (table,) = fenced_blocks(WRITING_A_SUITE, "toml")
    filename = module.splitlines()[0].removeprefix("# ").strip()
    (tmp_path / filename).write_text(module)
    points = tomllib.loads(table)["project"]["entry-points"]
    info = tmp_path / "toy_suite-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-suite\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) for group, entries in points.items()
        )
    )
    commands = documented_commands(WRITING_A_SUITE)
    assert len(commands) == 4, commands
    outputs = []
    for command, expected in commands:
        completed = run(command, tmp_path, path=str(tmp_path))
        output = completed.stdout + completed.stderr
        assert "Traceback" not in output, (command, output[-2000:])
        assert completed.returncode == (0 if expected is None else expected), (command, output[-2000:])
        outputs.append(output)
    listed, clean, buggy, encoder = outputs
    assert "first_position" in listed.split("Reference presets")[0]
    assert "first_position  PASS" in " ".join(clean.split()).replace("first_position PASS", "first_position  PASS")
    assert "first_position/later_tokens: changing the tokens after position 0" in buggy
    assert "this suite checks decoder-only models" in encoder


#: the README's cap: a first read of about ten minutes; the rest is in docs/ behind its index
README_BYTES = 15_000


def test_the_readme_fits_a_first_read_and_the_docs_have_an_index() -> None:
    readme = ROOT / "README.md"
    assert readme.stat().st_size <= README_BYTES, f"README.md is {readme.stat().st_size} bytes, over {README_BYTES}"
    index = (ROOT / "docs" / "README.md").read_text()
    linked = set(re.findall(r"\]\(([^)#]+)\)", index))
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")} - {"README.md"}
    assert pages <= linked, f"docs/README.md does not link {sorted(pages - linked)}"
    assert "## The user's guide" in index and "## Maintainers' notes" in index


def test_the_version_is_one_line() -> None:
    completed = subprocess.run([sys.executable, "-m", "maskcheck", "--version"], capture_output=True, text=True)
    assert completed.returncode == 0 and re.fullmatch(r"maskcheck \S+\n", completed.stdout), completed.stdout
