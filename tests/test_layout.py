"""The layout of `src/` reads as the DAG: no import circles, and package `__init__` files that only re-export.

Imports are read with `ast`, every one of them: at module level and inside functions (a lazy import closes a circle
as surely when it runs). `from a.b import c` is an edge to `a.b.c` when that is a module, else to `a.b`; importing
`a.b.c` also runs `a/__init__` and `a/b/__init__`, edges too, except into the importer's own enclosing packages
(already being imported when it runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import REPO

SRC = REPO / "src"
PACKAGES = ("xtrain", "xtrain_backend_side")


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for package in PACKAGES for path in sorted((SRC / package).rglob("*.py"))}


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The project modules that importing `name` (at `path`) runs, directly."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for alias in node.names:
                targets.add(f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module)
    edges = set()
    own_packages = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    for target in targets:
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            step = ".".join(parts[:i])
            if step in known and step not in own_packages and step != name:
                edges.add(step)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each strongly connected group of modules (Tarjan), each as a path back to its start."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(circle_in(graph, group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def circle_in(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for nxt in sorted(graph[node] & group):
                if nxt == start:
                    return paths[node] + [start]
                if nxt not in paths:
                    paths[nxt] = paths[node] + [nxt]
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no circle through {start}")


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def test_no_import_circles():
    found = cycles(import_graph())
    assert found == [], "import circles: " + "; ".join(" -> ".join(circle) for circle in found)


def test_the_circle_finder_names_a_circle_through_a_lazy_import():
    graph = {"xtrain.plan": {"xtrain.train.backends"}, "xtrain.train.backends": {"xtrain.recipe", "xtrain.plan"},
             "xtrain.recipe": set()}
    assert cycles(graph) == [["xtrain.plan", "xtrain.train.backends", "xtrain.plan"]]


def test_importing_a_submodule_runs_the_packages_above_it(tmp_path):
    """`from ..train.backends.capabilities import X` in xtrain.plan.planner also runs xtrain.train's and
    xtrain.train.backends' `__init__`: a circle through a package's re-exports is found."""
    root = tmp_path / "xtrain"
    for folder, init in (("", ""), ("plan", "from .planner import make_plan\n"),
                         ("train", "from .run import run_training\n")):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").write_text(init)
    (root / "plan" / "planner.py").write_text("from ..train.capabilities import TABLE\n")
    (root / "train" / "capabilities.py").write_text("TABLE = {}\n")
    (root / "train" / "run.py").write_text("from ..plan import make_plan\n")
    known = {module_name(path, tmp_path): path for path in sorted(root.rglob("*.py"))}
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert graph["xtrain.plan.planner"] == {"xtrain.train", "xtrain.train.capabilities"}
    assert cycles(graph) == [["xtrain.plan", "xtrain.plan.planner", "xtrain.train", "xtrain.train.run", "xtrain.plan"]]


def test_package_inits_open_with_what_they_own_and_only_re_export():
    """Every package of xtrain (xtrain_backend_side is the lanes' own code, not a stage); `__all__` and
    `__version__` are the only names an `__init__` defines."""
    for path in sorted((SRC / "xtrain").rglob("__init__.py")):
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path}: open with a paragraph on what the package owns"
        for node in tree.body[1:]:
            re_export = isinstance(node, ast.ImportFrom) or (
                isinstance(node, ast.Assign)
                and all(isinstance(t, ast.Name) and t.id in ("__all__", "__version__") for t in node.targets))
            assert re_export, f"{path}:{node.lineno}: a package's __init__ only re-exports; move this into a module"
