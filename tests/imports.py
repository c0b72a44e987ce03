"""Import facts of the checkout's packages, for the house rules.

Used by tests/test_house.py (recipes: cycles, verl's one room) and tests/hybrid_engine/test_purity.py.
"""

from __future__ import annotations

import ast
from pathlib import Path


def module_name(path: Path, root: Path) -> str:
    """The dotted name of the module at ``path`` under ``root`` (a package's ``__init__.py`` is the package)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, module: str, is_package: bool, known: set[str]) -> list[tuple[int, str]]:
    """``(line, module)`` of every import of ``source`` (anywhere in it), relative imports resolved.

    ``from a import b`` counts as importing ``a.b`` when that is one of the ``known`` modules, else ``a``; a literal
    ``importlib.import_module("a")`` / ``__import__("a")`` counts as importing ``a``.
    """
    package = module.split(".") if is_package else module.split(".")[:-1]
    names: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                if node.level - 1 >= len(package):
                    raise AssertionError(f"{module}:{node.lineno}: relative import beyond the top-level package")
                base = ".".join(package[: len(package) - (node.level - 1)])
                parent = f"{base}.{node.module}" if node.module else base
            else:
                parent = node.module
            for alias in node.names:
                child = f"{parent}.{alias.name}"
                names.append((node.lineno, child if child in known else parent))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names.append((node.lineno, node.args[0].value))
    return names
