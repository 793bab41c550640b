"""The project's import graph, read from the source with ``ast`` (every import, at module top or
inside a function), for tests/test_layout.py: cycles, imports that go up a floor, and imports
inside functions that do not say why."""
from __future__ import annotations

import ast
import fnmatch
from pathlib import Path
from typing import Iterable, Sequence


def module_name(path: Path, root: Path) -> str:
    """``mdk/eval/voc.py`` -> ``mdk.eval.voc``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _targets(node: ast.AST, modules: set[str]) -> list[str]:
    """The project modules an import statement loads (``from a import b``: ``a.b`` if it is a
    module, else ``a``)."""
    names: list[str] = []
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
    out = []
    for name in names:
        parts = name.split(".")
        while parts and ".".join(parts) not in modules:
            parts.pop()
        if parts:
            out.append(".".join(parts))
    if isinstance(node, ast.ImportFrom) and any(t != node.module for t in out):
        out = [t for t in out if t != node.module]  # `from pkg import mod`: the module, not pkg
    return sorted(set(out))


def import_graph(files: Iterable[Path], root: Path) -> dict[str, set[str]]:
    """module -> the project modules it imports (anywhere in the file)."""
    files = list(files)
    modules = {module_name(p, root) for p in files}
    graph: dict[str, set[str]] = {}
    for p in files:
        src = module_name(p, root)
        edges = graph.setdefault(src, set())
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges.update(t for t in _targets(node, modules) if t != src)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other in a loop (strongly connected components of
    more than one module; Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        comp.append(m)
                        if m == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter
                counter += 1
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(sorted(graph.get(nxt, ())))))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    return sorted(found)


def floor_of(module: str, floors: Sequence[Sequence[str]]) -> int:
    """The floor of ``module``: the first floor (from the ground) with a pattern that matches it
    or one of its parent packages (fnmatch patterns)."""
    names = [".".join(module.split(".")[:k]) for k in range(len(module.split(".")), 0, -1)]
    for name in names:
        for level, patterns in enumerate(floors):
            if any(fnmatch.fnmatchcase(name, pat) for pat in patterns):
                return level
    raise KeyError(f"{module} is on no floor; add it to the floors table")


def upward(graph: dict[str, set[str]], floors: Sequence[Sequence[str]]) -> list[str]:
    """``a -> b`` for every import of a module on a higher floor than the importer's."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if floor_of(b, floors) > floor_of(a, floors))


def unexplained_local_imports(path: Path) -> list[str]:
    """Imports inside a function without a reason: a comment on their line, or on the line just
    above their block of imports."""
    lines = path.read_text().splitlines()
    bad = []
    for fn in ast.walk(ast.parse("\n".join(lines), str(path))):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            k = node.lineno - 1
            if "#" in lines[k]:
                continue
            j = k - 1
            while j >= 0 and lines[j].strip().startswith(("import ", "from ")):
                j -= 1
            if j < 0 or not lines[j].strip().startswith("#"):
                bad.append(f"{path.name}:{node.lineno}: {lines[k].strip()}")
    return sorted(set(bad))
