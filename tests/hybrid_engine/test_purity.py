"""hybrid_engine is the pure library: no module of it imports verl, Hydra, OmegaConf or the recipes.

Checked twice: statically (every import statement of every module, also inside functions, ``TYPE_CHECKING`` blocks
and ``try``, relative imports resolved, plus ``importlib.import_module("...")`` / ``__import__("...")`` with a
literal name), and at run time (a fresh interpreter that imports the public modules loads none of them).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.imports import imported_modules, module_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "hybrid_engine"
_KNOWN = {module_name(path, ROOT) for path in PACKAGE.rglob("*.py")}
FORBIDDEN = ("verl", "hydra", "omegaconf", "recipes")


def _module_name(path: Path) -> str:
    return module_name(path, ROOT)


def _imported_names(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every import in ``source``, the source of ``module``."""
    return imported_modules(source, module, is_package, _KNOWN)


def _forbidden_imports(path: Path) -> list[str]:
    module = _module_name(path)
    found = _imported_names(path.read_text(), module, path.name == "__init__.py")
    return [f"{module}:{line} imports {name}" for line, name in found if name.split(".")[0] in FORBIDDEN]


def test_every_module_is_checked():
    modules = sorted(PACKAGE.rglob("*.py"))
    names = {_module_name(path) for path in modules}
    assert {"hybrid_engine", "hybrid_engine.plan.build", "hybrid_engine.reshard.executor"} <= names


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_module_imports_no_verl_hydra_omegaconf_or_recipes(path):
    assert _forbidden_imports(path) == []


@pytest.mark.parametrize(
    ("source", "module", "is_package", "expected"),
    [
        ("import verl.utils", "hybrid_engine.plan.build", False, "verl.utils"),
        ("def f():\n    from omegaconf import OmegaConf", "hybrid_engine.layout", False, "omegaconf"),
        ("if TYPE_CHECKING:\n    import hydra", "hybrid_engine.groups", False, "hydra"),
        ("from .. import layout", "hybrid_engine.plan.build", False, "hybrid_engine.layout"),
        ("from .build import Plan", "hybrid_engine.plan", True, "hybrid_engine.plan.build"),
        ("from recipes.check.plan import make_plan", "hybrid_engine.plan.build", False, "recipes.check.plan"),
        ("importlib.import_module('recipes.check.plan')", "hybrid_engine.layout", False, "recipes.check.plan"),
    ],
)
def test_the_checker_sees_every_kind_of_import(source, module, is_package, expected):
    assert expected in [name for _, name in _imported_names(source, module, is_package)]


def test_the_checker_refuses_a_relative_import_beyond_the_package():
    with pytest.raises(AssertionError, match="beyond the top-level package"):
        _imported_names("from ...recipes import plan", "hybrid_engine.reshard.executor", False)


def test_importing_the_library_loads_none_of_them():
    code = (
        "import hybrid_engine.plan, hybrid_engine.reshard, hybrid_engine.layout, hybrid_engine.model_spec,"
        " hybrid_engine.groups; import sys;"
        " print(sorted(m for m in sys.modules if m.split('.')[0] in ('verl','hydra','omegaconf','recipes')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"
