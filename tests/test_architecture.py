"""The code's shape, read from its source: no import cycle at run time among the modules of
``backend/`` and ``console/``, the engine never imports the console, and nothing in the
engine imports Textual (the client interface the console drives stays free of it).

An import counts wherever it runs: at module level and inside functions. Imports under
``if TYPE_CHECKING:`` never run and do not count for cycles. A package's ``__init__``
importing its own submodules (re-exporting their names) is no edge: that is the package
presenting its parts, not one part depending on another."""

from __future__ import annotations

import ast
import functools
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("backend", "console")


@dataclass(frozen=True)
class Import:
    """One import statement's effect: ``source`` imports ``names`` from ``target`` at ``line``.

    ``target`` is a project module when the import resolves to one, else the imported
    (external) module's dotted name. ``type_only`` marks imports under ``TYPE_CHECKING``."""

    source: str
    target: str
    names: tuple[str, ...]
    line: int
    type_only: bool


@dataclass
class ImportGraph:
    """The project's modules and every import among them and to the outside."""

    modules: dict[str, Path]
    imports: list[Import] = field(default_factory=list)

    def runtime_edges(self) -> dict[str, dict[str, list[Import]]]:
        """source -> target -> the imports behind the edge, for imports that run, between
        project modules, without a package's edges to its own submodules."""
        edges: dict[str, dict[str, list[Import]]] = {name: {} for name in self.modules}
        for imp in self.imports:
            if imp.type_only or imp.target not in self.modules or imp.target == imp.source:
                continue
            if is_package(self.modules[imp.source]) and imp.target.startswith(imp.source + "."):
                continue
            edges[imp.source].setdefault(imp.target, []).append(imp)
        return edges


def is_package(path: Path) -> bool:
    return path.name == "__init__.py"


def find_modules(root: Path, packages: tuple[str, ...]) -> dict[str, Path]:
    """Every importable module under the packages, by dotted name (files whose names are not
    identifiers, such as ``*.cron.py`` definition files, are loaded by path, not imported)."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            if all(part.isidentifier() for part in parts):
                modules[".".join(parts)] = path
    return modules


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Collector(ast.NodeVisitor):
    """Collects one module's imports, in functions and classes too, marking those that only
    type checkers see."""

    def __init__(self, module: str, is_package: bool, modules: dict[str, Path]) -> None:
        self.module = module
        self.package = module if is_package else module.rpartition(".")[0]
        self.modules = modules
        self.imports: list[Import] = []
        self.type_only = False

    def visit_If(self, node: ast.If) -> None:
        if not is_type_checking(node.test):
            self.generic_visit(node)
            return
        self.visit(node.test)
        outer, self.type_only = self.type_only, True
        for stmt in node.body:
            self.visit(stmt)
        self.type_only = outer
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, (alias.name,), node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            anchor = self.package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, node.module] if node.module else anchor)
        else:
            base = node.module or ""
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            if submodule in self.modules:
                self._add(submodule, (alias.name,), node.lineno)
            else:
                self._add(base, (alias.name,), node.lineno)

    def _add(self, target: str, names: tuple[str, ...], line: int) -> None:
        self.imports.append(Import(self.module, target, names, line, self.type_only))


def collect(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> ImportGraph:
    modules = find_modules(root, packages)
    graph = ImportGraph(modules)
    for name, path in modules.items():
        collector = _Collector(name, is_package(path), modules)
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        graph.imports.extend(collector.imports)
    return graph


def strongly_connected(edges: dict[str, dict[str, list[Import]]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges[node]):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def cycles(edges: dict[str, dict[str, list[Import]]]) -> list[list[str]]:
    """Cycles that together use every edge inside each strongly connected component: for
    each edge not yet on a listed cycle, the shortest way back to its start."""
    found: list[list[str]] = []
    for component in strongly_connected(edges):
        members = set(component)
        covered: set[tuple[str, str]] = set()
        for source in component:
            for target in sorted(edges[source]):
                if target not in members or (source, target) in covered:
                    continue
                back = _shortest_path(edges, members, target, source)
                cycle = [source, *back]
                covered.update(zip(cycle, cycle[1:], strict=False))
                found.append(cycle)
    return found


def _shortest_path(edges: dict[str, dict[str, list[Import]]], members: set[str], start: str, goal: str) -> list[str]:
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            break
        for succ in sorted(edges[node]):
            if succ in members and succ not in previous:
                previous[succ] = node
                queue.append(succ)
    path: list[str] = []
    step: str | None = goal
    while step is not None:
        path.append(step)
        step = previous[step]
    return path[::-1]


def describe(cycle: list[str], edges: dict[str, dict[str, list[Import]]]) -> str:
    lines = [" -> ".join(cycle)]
    for source, target in zip(cycle, cycle[1:], strict=False):
        names = ", ".join(f"{', '.join(imp.names)} (line {imp.line})" for imp in edges[source][target])
        lines.append(f"    {source} -> {target}: {names}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# the project
# ---------------------------------------------------------------------------------------
@functools.cache
def project() -> ImportGraph:
    """The project's graph, read once for all the tests here."""
    return collect()


def test_no_import_cycle_at_run_time() -> None:
    edges = project().runtime_edges()
    found = cycles(edges)
    report = "\n".join(describe(cycle, edges) for cycle in found)
    assert not found, f"{len(found)} import cycles at run time:\n{report}"


def test_the_engine_never_imports_the_console() -> None:
    graph = project()
    wrong = [imp for imp in graph.imports if imp.source.startswith("backend") and imp.target.split(".")[0] == "console"]
    assert not wrong, "\n".join(f"{imp.source} imports {imp.target} (line {imp.line})" for imp in wrong)


def test_nothing_in_the_engine_imports_textual() -> None:
    # The client interface (backend/client/interface.py) is what the console drives; neither it
    # nor anything it can reach in backend/ may need Textual, even for type checking.
    graph = project()
    assert "backend.client.interface" in graph.modules
    wrong = [imp for imp in graph.imports if imp.source.startswith("backend") and imp.target.split(".")[0] == "textual"]
    assert not wrong, "\n".join(f"{imp.source} imports {imp.target} (line {imp.line})" for imp in wrong)


def test_the_engines_parts_are_not_handed_the_engine() -> None:
    # Each part of backend/scheduler/ gets what it uses (arguments, or a bundle of parts);
    # only the lifecycle, which orders the facade's own steps, names Engine, for its types.
    graph = project()
    wrong = [
        imp
        for imp in graph.imports
        if imp.target == "backend.scheduler.engine"
        and imp.source.startswith("backend.scheduler.")
        and not (imp.source == "backend.scheduler.lifecycle" and imp.type_only)
    ]
    assert not wrong, "\n".join(f"{imp.source} imports {', '.join(imp.names)} from {imp.target} (line {imp.line})" for imp in wrong)


def test_the_shared_data_knows_no_locks() -> None:
    # backend/model.py is the plain data every layer shares; what a handler receives (its
    # lock's lease, the engine's locks) is the schedules' (backend.schedules.RunContext).
    graph = project()
    wrong = [imp for imp in graph.imports if imp.source == "backend.model" and imp.target.split(".")[:2] == ["backend", "locks"]]
    assert not wrong, "\n".join(f"backend.model imports {', '.join(imp.names)} from {imp.target} (line {imp.line})" for imp in wrong)


# ---------------------------------------------------------------------------------------
# the checker itself, on a small made-up project
# ---------------------------------------------------------------------------------------
def write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def test_the_checker_sees_imports_in_functions_and_resolves_submodules(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "app/__init__.py": "from app.core import Core\nfrom app import parts\n",
            "app/core.py": "def make():\n    from app.parts import helper\n    return helper\n",
            "app/parts/__init__.py": "",
            "app/parts/helper.py": "from app import core\n",
            "app/typed.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from app.core import Core\nelse:\n    import app.other\n"
            ),
            "app/other.py": "import os\nfrom . import typed\n",
            "app/data.cron.py": "import app.core\n",
        },
    )
    graph = collect(tmp_path, ("app",))
    assert "app.data.cron" not in graph.modules
    edges = graph.runtime_edges()
    assert edges["app"] == {}  # its own submodules
    assert set(edges["app.core"]) == {"app.parts.helper"}  # `from pkg import name`: the submodule
    assert set(edges["app.parts.helper"]) == {"app.core"}
    assert set(edges["app.typed"]) == {"app.other"}  # the else branch runs
    assert set(edges["app.other"]) == {"app.typed"}  # relative, from the package
    found = cycles(edges)
    assert found == [["app.core", "app.parts.helper", "app.core"], ["app.other", "app.typed", "app.other"]]
    text = describe(found[0], edges)
    assert text.splitlines()[0] == "app.core -> app.parts.helper -> app.core"
    assert "app.parts.helper -> app.core: core (line 1)" in text


def test_the_checker_finds_no_cycle_in_a_chain(tmp_path: Path) -> None:
    write(tmp_path, {"app/__init__.py": "", "app/a.py": "import app.b\n", "app/b.py": "from app.c import x\n", "app/c.py": "x = 1\n"})
    edges = collect(tmp_path, ("app",)).runtime_edges()
    assert set(edges["app.a"]) == {"app.b"} and set(edges["app.b"]) == {"app.c"}
    assert cycles(edges) == []
