"""House rules for the imports of ``recipes/``, checked statically (nothing is imported).

* every import statement inside a function or method says why it is lazy: a comment containing ``lazy:`` on its line
  or on the line just above it (start-up time of the CLI, an import only some processes may do, an import that must
  wait until verl is imported, an optional dependency); every other import sits at the top of its file;
* the modules of ``recipes`` import each other without cycles (module-level and function-level imports alike);
* only ``recipes/verl_ext/`` imports verl; the rest of the pack reaches it through ``recipes.verl_ext.api``.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

from tests.imports import imported_modules, module_name

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "recipes"
VERL_ROOM = PACKAGE / "verl_ext"
LAZY_MARK = "lazy:"



def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _module_name(path: Path) -> str:
    return module_name(path, ROOT)


# -- (a) function-level imports say why they are lazy -----------------------------------------------------------------


def _comment_lines(source: str, marker: str) -> set[int]:
    """Line numbers of the comments of ``source`` that contain ``marker`` (comments only, not strings)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {tok.start[0] for tok in tokens if tok.type == tokenize.COMMENT and marker in tok.string}


def _function_level_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement inside a function or method (at any depth, also in a class defined in a function)."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)) and in_function:
                found.append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(tree, False)
    return sorted(found, key=lambda node: node.lineno)


def _unexplained_lazy_imports(source: str) -> list[tuple[int, str]]:
    """``(line, statement)`` of each function-level import of ``source`` with no ``lazy:`` comment on its line or on
    the line just above it."""
    marked = _comment_lines(source, LAZY_MARK)
    return [
        (node.lineno, ast.unparse(node))
        for node in _function_level_imports(ast.parse(source))
        if node.lineno not in marked and node.lineno - 1 not in marked
    ]


def _violations() -> dict[str, list[tuple[int, str]]]:
    found = {}
    for path in _sources():
        unexplained = _unexplained_lazy_imports(path.read_text())
        if unexplained:
            found[_rel(path)] = unexplained
    return found


def test_function_level_imports_say_why_they_are_lazy():
    listed = [
        f"{path}:{line}: {statement}"
        for path, found in _violations().items()
        for line, statement in found
    ]
    assert not listed, (
        "import inside a function without a `# lazy: <why>` comment on its line or the line above "
        "(move it to the top of the file, or say why it must wait):\n" + "\n".join(listed)
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os\ndef f():\n    import json\n", [(3, "import json")]),
        ("def f():\n    import json  # lazy: only here\n", []),
        ("def f():\n    # lazy: only here\n    from json import dumps\n", []),
        ("def f():\n    # lazy: only here\n\n    import json\n", [(4, "import json")]),
        ("def f():\n    s = '# lazy: in a string'; import json\n", [(2, "import json")]),
        ("class A:\n    def m(self):\n        from . import b\n", [(3, "from . import b")]),
        ("def f():\n    class B:\n        import json\n", [(3, "import json")]),
        ("async def f():\n    if True:\n        import json\n", [(3, "import json")]),
        ("try:\n    import json\nexcept ImportError:\n    json = None\nclass A:\n    import os\n", []),
    ],
)
def test_the_lazy_checker(source, expected):
    assert _unexplained_lazy_imports(source) == expected


# -- the import graph among recipes.* ----------------------------------------------------------------------------------


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in _sources()}
    known = set(paths)
    graph = {}
    for module, path in paths.items():
        found = imported_modules(path.read_text(), module, path.name == "__init__.py", known)
        graph[module] = {name for _, name in found if name in known}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every elementary cycle of ``graph``, each starting at its smallest module and closed: ``[a, b, a]``."""
    cycles = []
    order = sorted(graph)
    for start in order:
        allowed = {node for node in order if node >= start}
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(graph.get(node, ()), reverse=True):
                if nxt == start:
                    cycles.append([*path, start])
                elif nxt in allowed and nxt not in path:
                    stack.append((nxt, [*path, nxt]))
    return sorted(cycles)


def test_the_graph_covers_the_package():
    graph = _graph()
    assert {"recipes", "recipes.launch", "recipes.verl_ext.api", "recipes.verl_ext.plugin"} <= set(graph)
    assert "recipes.verl_ext.api" in graph["recipes.cluster.nccl_env"]


def test_recipes_has_no_import_cycles():
    cycles = _cycles(_graph())
    assert not cycles, "import cycles among recipes.*:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("from recipes.verl_ext import api", "recipes.cluster.nccl_env", False, "recipes.verl_ext.api"),
        ("from recipes.compose.compose import compose_recipe", "recipes.run.train", False, "recipes.compose.compose"),
        ("from recipes.verl_ext import nothing", "recipes.run.train", False, "recipes.verl_ext"),
        ("def f():\n    from ..stability import guard", "recipes.verl_ext.plugin.patches", False,
         "recipes.verl_ext.stability.guard"),
        ("from . import api", "recipes.verl_ext", True, "recipes.verl_ext.api"),
        ("from .api import roles", "recipes.verl_ext", True, "recipes.verl_ext.api"),
        ("import verl.utils", "recipes.run.train", False, "verl.utils"),
        ("importlib.import_module('verl')", "recipes.run.train", False, "verl"),
    ],
)
def test_the_graph_checker_sees_every_kind_of_import(source, module, is_package, expected):
    known = {"recipes.verl_ext", "recipes.verl_ext.api", "recipes.compose.compose", "recipes.verl_ext.stability.guard"}
    assert expected in [name for _, name in imported_modules(source, module, is_package, known)]


def test_the_cycle_finder():
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"c"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "a"], ["c", "c"]]


# -- only recipes/verl_ext/ touches verl ------------------------------------------------------------------------------


def test_only_verl_ext_touches_verl():
    known = {_module_name(path) for path in _sources()}
    found = []
    for path in _sources():
        if path.is_relative_to(VERL_ROOM):
            continue
        module = _module_name(path)
        for line, name in imported_modules(path.read_text(), module, path.name == "__init__.py", known):
            if name == "verl" or name.startswith("verl."):
                found.append(f"{_rel(path)}:{line}: imports {name}")
    assert not found, "outside recipes/verl_ext/, reach verl through recipes.verl_ext.api:\n" + "\n".join(found)
