"""The packages depend on each other in one direction (docs/design.md, "Layers").

Every module's imports are read with ``ast``, those inside function bodies included (a
lazy import is still a dependency), and resolved to the module they name. A module may
import its own package and the layers below it; an import of a higher layer, of a
sibling at the same rank, or a circle of modules fails with the modules named.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: the repository's folders and the packages they install as
FOLDERS = {
    "maskcheck": "maskcheck",
    "harness": "maskcheck.harness",
    "suites": "maskcheck.suites",
    "reference_models": "maskcheck.reference_models",
}
#: lowest first; packages of one rank may not import each other
LAYERS: tuple[tuple[str, ...], ...] = (
    ("maskcheck.reference_models",),
    ("maskcheck.harness.adapters",),
    ("maskcheck.harness.engine",),
    ("maskcheck.harness.report",),
    ("maskcheck.suites",),
    ("maskcheck.harness.audits", "maskcheck.harness.compare"),
    ("maskcheck.harness.cli", "maskcheck.harness.plugin"),
    ("maskcheck.harness",),  # the package itself, and the shims at the module paths 0.2.0 bundles import
    ("maskcheck",),  # the public API (it loads the rest lazily, by name)
)


def module_name(path: Path) -> str:
    relative = path.relative_to(ROOT).with_suffix("")
    parts = [FOLDERS[relative.parts[0]], *relative.parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The maskcheck modules ``path`` imports anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import name` names a module when pkg.name is one
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
        else:
            continue
        found.update(t for t in targets if t == "maskcheck" or t.startswith("maskcheck."))
    return found - {name}


def layer_of(name: str) -> tuple[int, str]:
    """(rank, package) of the deepest listed package that holds ``name``."""
    best = None
    for rank, packages in enumerate(LAYERS):
        for package in packages:
            if (name == package or name.startswith(package + ".")) and (best is None or len(package) > len(best[1])):
                best = (rank, package)
    assert best is not None, f"{name} is in no layer: add its package to LAYERS and to docs/design.md"
    return best


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def test_every_import_points_down_or_within_its_package() -> None:
    wrong = []
    for name, targets in graph().items():
        rank, package = layer_of(name)
        for target in sorted(targets):
            target_rank, target_package = layer_of(target)
            if target_package != package and target_rank >= rank:
                direction = "a sibling of the same rank" if target_rank == rank else "a higher layer"
                wrong.append(f"{name} imports {target} ({direction}: {target_package})")
    assert not wrong, "imports against the layer order of docs/design.md:\n" + "\n".join(wrong)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected set of more than one module (Tarjan), as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_circle_of_imports() -> None:
    edges = graph()
    # A package's __init__ re-exporting its modules is not a circle with them.
    for name in list(edges):
        edges[name] = {t for t in edges[name] if not (t == name.rpartition(".")[0] and edges.get(t, set()) & {name})}
    found = cycles(edges)
    assert not found, "modules that import each other, directly or around a circle:\n" + "\n".join(
        " <-> ".join(c) for c in found
    )


def test_the_check_finds_an_upward_import_and_a_circle(tmp_path: Path) -> None:
    """The two rules above fail on what they exist to catch. The probe module's source is
    written outside the tree (its name says where it would sit): a file in the tree would
    be read by the other tests of this module, run at the same time on other workers."""
    assert layer_of("maskcheck.harness.engine.suite")[0] < layer_of("maskcheck.suites.padding")[0]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []
    source = "def f():\n    from ...suites.padding import PaddingSuite\n"
    scratch = tmp_path / "_scratch_layer_probe.py"
    scratch.write_text(source)
    found = imports("maskcheck.harness.engine._scratch_layer_probe", scratch, set(modules()))
    assert "maskcheck.suites.padding" in found
