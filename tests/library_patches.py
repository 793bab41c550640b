"""Where a source file changes a library instead of using it, read with ``ast``, for
tests/test_layout.py: an assignment to (or ``del`` of) an attribute of Hydra, OmegaConf, torch or
submitit, a ``setattr``/``delattr`` on one, a ``monkeypatch.setattr`` or ``mock.patch`` of one, and
an import of Hydra's private modules (``hydra._internal``).

"An attribute of a library" is one reached from a name the file bound by importing from the
library (``import torch``, ``from hydra.core import plugins as p``, ``x =
importlib.import_module("torch...")``, or such a name's attribute assigned to another name).
Objects the library returns (a DictConfig, a module's parameters) are the file's own data.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Optional

LIBRARIES = ("hydra", "omegaconf", "torch", "submitit")
PRIVATE = "hydra._internal"
# torch's documented settings (https://pytorch.org/docs/stable/backends.html): set by assignment.
SETTINGS = {"torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic",
            "torch.backends.cudnn.allow_tf32", "torch.backends.cuda.matmul.allow_tf32"}
_IMPORTERS = {"importlib.import_module", "import_module", "__import__"}
_PATCHERS = ("setattr", "delattr", "patch", "patch.object", "patch.dict", "patch.multiple")


def _ours(name: str) -> bool:
    return name.split(".")[0] in LIBRARIES


def _dotted(node: ast.AST) -> Optional[str]:
    """``a.b.c`` of a Name/Attribute chain, else None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


def _text(node: ast.AST) -> Optional[str]:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


class _Scan(ast.NodeVisitor):
    def __init__(self) -> None:
        self.bound: dict[str, str] = {}  # a name in the file -> the library path it stands for
        self.found: list[tuple[int, str]] = []

    def library(self, node: ast.AST) -> Optional[str]:
        """The library path ``node`` stands for (``torch.nn.Module``), or None."""
        if isinstance(node, ast.Name):
            return self.bound.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.library(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            func, args = _dotted(node.func), node.args
            if func == "getattr" and len(args) >= 2 and _text(args[1]):
                base = self.library(args[0])
                return f"{base}.{_text(args[1])}" if base else None
            if func in _IMPORTERS and args and _text(args[0]) and _ours(_text(args[0])):
                return _text(args[0])
        if isinstance(node, ast.Subscript) and _dotted(node.value) == "sys.modules":
            name = _text(node.slice)
            return name if name and _ours(name) else None
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if _ours(a.name):
                self.private(node, a.name)
                if a.asname:
                    self.bound[a.asname] = a.name
                else:
                    head = a.name.split(".")[0]
                    self.bound[head] = head

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and node.level == 0 and _ours(node.module):
            for a in node.names:
                self.private(node, f"{node.module}.{a.name}")
                self.bound[a.asname or a.name] = f"{node.module}.{a.name}"

    def private(self, node: ast.AST, name: str) -> None:
        if name == PRIVATE or name.startswith(PRIVATE + "."):
            self.found.append((node.lineno, f"imports {name}"))

    def visit_Assign(self, node: ast.Assign) -> None:
        source = self.library(node.value)
        for target in node.targets:
            self.target(target, node)
            if source and isinstance(target, ast.Name):
                self.bound[target.id] = source  # an alias: its attributes are the library's
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.target(node.target, node)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.target(node.target, node)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self.target(target, node, "deletes")
        self.generic_visit(node)

    def target(self, target: ast.AST, node: ast.AST, verb: str = "assigns to") -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for t in target.elts:
                self.target(t, node, verb)
            return
        if isinstance(target, (ast.Attribute, ast.Subscript)):
            owner = self.library(target.value)
            if owner is None:
                return
            what = f"{owner}.{target.attr}" if isinstance(target, ast.Attribute) else f"{owner}[]"
            if what not in SETTINGS:
                self.found.append((node.lineno, f"{verb} {what}"))

    def visit_Call(self, node: ast.Call) -> None:
        func = _dotted(node.func) or ""
        if node.args and any(func == p or func.endswith("." + p) for p in _PATCHERS):
            first = node.args[0]
            what = self.library(first) or (_text(first) if _ours(_text(first) or "-") else None)
            if what:
                self.found.append((node.lineno, f"{func}({what}, ...)"))
        self.generic_visit(node)


def library_patches(path: Path, source: Optional[str] = None) -> list[tuple[int, str]]:
    """(line, what) for each change to a library and each private Hydra import in ``path``."""
    scan = _Scan()
    scan.visit(ast.parse(path.read_text() if source is None else source, str(path)))
    return scan.found
