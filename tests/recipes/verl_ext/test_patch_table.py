"""Every patch the pack makes to another project is a row of ``recipes.verl_ext.patch_table.PATCHES``, and every row
is a patch the code makes. Checked statically: each ``.py`` file under ``recipes/`` and ``hydra_plugins/`` is read
with :mod:`ast` (nothing is imported).

What a name holds. The scanner follows, within each file, what every name can hold (all its bindings in a scope
at once, not in order):

* another project's object, by its dotted name: a name bound by an import of anything that is neither the standard
  library nor the pack (``recipes``, ``hybrid_engine``, ``hydra_plugins.klppo_launcher``; Hydra's ``hydra_plugins``
  namespace itself is Hydra's); the first parameter of a callback registered with
  ``when_imported("<module>", callback)``, which receives that module (a callback by name, a lambda, or a name bound
  to ``factory(<constants>)`` whose nested function is read with the factory's arguments); ``sys.modules.get(name)``
  and ``importlib.import_module(name)`` of such a module; and an attribute of such an object (``x.a``,
  ``getattr(x, "a")``);
* the pack's own object: a ``def``/``class`` of the file, or what calling one returns;
* a constant, a tuple of values (for ``for a, b in (...)``), or a module-level name bound to one;
* anything else is unknown: a parameter, the result of a call (a new object: a config, a tensor, a wrapper).

What counts as a patch (a *site*), with its target:

1. ``wrap_once(owner, "attr", ...)``: ``<owner>.attr``;
2. ``setattr(x, "attr", v)`` and ``object.__setattr__(x, "attr", v)``, unless ``x`` is ``self``/``cls`` or the
   pack's own object: ``<x>.attr``; the body of ``wrap_once`` itself is the mechanism, and its call sites are rule 1;
3. an assignment to, or ``del`` of, ``sys.modules[key]``: ``sys.modules['<key>']``;
4. an assignment (plain, augmented, annotated) to, or ``del`` of, an attribute or an item of another project's
   object: ``<dotted name>`` or ``<dotted name>[<key>]``;
5. an assignment to an ``_private`` attribute of an unknown object (an instance another project hands in):
   ``<name as written>._private``;
6. a call of another project's ``register``/``register_*`` function or method (its registries, Ray's
   pickle-by-value): the callee's dotted name. A public hook, but it changes the other project's state for the whole
   process.

A row marked ``reads`` (a private registry the pack only reads) matches any read of its target in its module.

Not sites: writes through ``self``/``cls`` (a wrapper's changes to the instance belong to the wrapped method's row),
writes to the pack's own objects and to unknown objects' public attributes (configs, records, tensors the pack
made), and the standard library (``os.environ``, ``sys.meta_path``).

Matching: a row matches a site when the row's ``module`` is the site's file (relative to the repository root) and
the site's target is the row's ``seen_as`` where it has one, else its ``target``. Where a name holds several values
(a callback registered for two modules, a loop over two classes) there is one site per value, hence one row per
target.
"""

from __future__ import annotations

import ast
import importlib.metadata
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from recipes.verl_ext.patch_table import PATCHES, rows_for
from recipes.verl_ext.plugin.megatron_no_te import SUPPORTED_MEGATRON
from recipes.verl_ext.plugin.patches import SUPPORTED_VERL

ROOT = Path(__file__).resolve().parents[3]
SCANNED = ("recipes", "hydra_plugins")
OWN = ("recipes", "hybrid_engine", "hydra_plugins.klppo_launcher")
SELF = ("self", "cls")


@dataclass(frozen=True, order=True)
class Site:
    module: str
    target: str
    line: int = 0

    def key(self) -> tuple[str, str]:
        return self.module, self.target


# ---- values a name can hold ------------------------------------------------------------------------------------------

# ("foreign", "dotted.name") another project's object | ("std", "dotted.name") the standard library's
# ("own", "name") the pack's object | ("const", value) | ("seq", (values, ...)) | ("unknown", "as written")


def _kind_of_module(name: str) -> str:
    if any(name == own or name.startswith(own + ".") for own in OWN):
        return "own"
    top = name.split(".")[0]
    return "std" if top in sys.stdlib_module_names or top == "__future__" else "foreign"


def _attribute(value: tuple, attr: str, written: str) -> tuple:
    kind, payload = value
    if kind in ("foreign", "std"):
        return kind, f"{payload}.{attr}"
    if kind == "own":
        return value
    return "unknown", written


def _key_text(values: frozenset, written: str) -> str:
    consts = [payload for kind, payload in values if kind == "const"]
    return repr(consts[0]) if len(consts) == 1 and len(values) == 1 else written


class _Scope:
    """The names of one scope (a module, a function, a lambda) and what each can hold."""

    def __init__(self, outer: _Scope | None, names: dict[str, frozenset] | None = None) -> None:
        self.outer = outer
        self.names: dict[str, frozenset] = dict(names or {})

    def lookup(self, name: str) -> frozenset | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.names:
                return scope.names[name]
            scope = scope.outer
        return None


def _own_nodes(body: list[ast.AST]):
    """The nodes of a scope's statements, not those of the functions, lambdas and classes defined in it."""
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # decorators and defaults run in this scope; the body does not
            stack.extend(node.decorator_list)
            if not isinstance(node, ast.ClassDef):
                stack.extend(d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None)
            continue
        if isinstance(node, ast.Lambda):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


class _File:
    """One file: its registrations and, scope by scope, its patch sites."""

    def __init__(self, path: Path, root: Path) -> None:
        self.rel = path.relative_to(root).as_posix()
        self.tree = ast.parse(path.read_text(), filename=str(path))
        self.sites: set[Site] = set()
        self.references: set[Site] = set()  # other projects' objects the file reads (for the table's read rows)
        self.problems: list[str] = []
        self.defs = {node.name: node for node in self.tree.body
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        self.module_scope = _Scope(None)
        self._bind_scope(self.module_scope, self.tree.body, params={})
        # function node -> the parameter bindings it is read with (one reading per registration)
        self.readings: dict[ast.AST, list[dict[str, frozenset]]] = {}
        self._find_registrations()

    # -- evaluation --

    def eval(self, node: ast.AST, scope: _Scope) -> frozenset:
        written = ast.unparse(node)
        if isinstance(node, ast.Name):
            values = scope.lookup(node.id)
            if values is None:
                return frozenset({("unknown", node.id)})
            # an unknown value is named as this site writes it, not where it came from
            return frozenset(("unknown", node.id) if kind == "unknown" else (kind, payload)
                             for kind, payload in values)
        if isinstance(node, ast.Constant):
            return frozenset({("const", node.value)})
        if isinstance(node, (ast.Tuple, ast.List)):
            return frozenset({("seq", tuple(self.eval(element, scope) for element in node.elts))})
        if isinstance(node, ast.Attribute):
            return frozenset(_attribute(value, node.attr, written) for value in self.eval(node.value, scope))
        if isinstance(node, ast.Subscript):
            key = _key_text(self.eval(node.slice, scope), ast.unparse(node.slice))
            return frozenset(
                (kind, f"{payload}[{key}]") if kind in ("foreign", "std") else ("unknown", written)
                for kind, payload in self.eval(node.value, scope)
            )
        if isinstance(node, ast.Call):
            return self._eval_call(node, scope, written)
        return frozenset({("unknown", written)})

    def _eval_call(self, node: ast.Call, scope: _Scope, written: str) -> frozenset:
        callee = self.eval(node.func, scope)
        if isinstance(node.func, ast.Name) and node.func.id == "getattr" and len(node.args) >= 2:
            attrs = self.eval(node.args[1], scope)
            out = set()
            for value in self.eval(node.args[0], scope):
                for kind, attr in attrs:
                    out.add(_attribute(value, attr, written) if kind == "const" else ("unknown", written))
            return frozenset(out)
        names = {payload for kind, payload in callee if kind == "std"}
        if names & {"sys.modules.get", "importlib.import_module"} and node.args:
            out = set()
            for kind, name in self.eval(node.args[0], scope):
                if kind == "const" and isinstance(name, str):
                    out.add((_kind_of_module(name), name))
                else:
                    out.add(("unknown", written))
            return frozenset(out)
        if callee and all(kind == "own" for kind, _ in callee):
            return frozenset({("own", written)})  # what the pack's own function or class returns
        return frozenset({("unknown", written)})

    @staticmethod
    def _targets(values: frozenset, written: str) -> list[str]:
        """The target names of ``values``: dotted names of objects, as written for unknown ones."""
        return sorted({payload if kind in ("foreign", "std") else written for kind, payload in values})

    # -- bindings --

    def _bind(self, scope: _Scope, target: ast.AST, values: frozenset) -> None:
        if isinstance(target, ast.Name):
            scope.names[target.id] = scope.names.get(target.id, frozenset()) | values
        elif isinstance(target, (ast.Tuple, ast.List)):
            for index, element in enumerate(target.elts):
                parts = set()
                for kind, payload in values:
                    if kind == "seq" and len(payload) == len(target.elts):
                        parts |= payload[index]
                    else:
                        parts.add(("unknown", ast.unparse(element)))
                self._bind(scope, element, frozenset(parts))

    def _bind_scope(self, scope: _Scope, body: list[ast.AST], params: dict[str, frozenset]) -> None:
        """Every binding of a scope, to a fixed point (a name bound from another takes all that one's values)."""
        scope.names.update(params)
        nodes = list(_own_nodes(body))
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                scope.names[node.name] = frozenset({("own", node.name)})
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.name if alias.asname else alias.name.split(".")[0]
                    kind = _kind_of_module(alias.name)
                    scope.names[alias.asname or name] = frozenset({(kind, name)})
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                kind = "own" if node.level else _kind_of_module(base)
                for alias in node.names:
                    scope.names[alias.asname or alias.name] = frozenset({(kind, f"{base}.{alias.name}")})
        for _ in range(10):
            before = dict(scope.names)
            for node in nodes:
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        self._bind(scope, target, self.eval(node.value, scope))
                elif isinstance(node, ast.AnnAssign) and node.value is not None:
                    self._bind(scope, node.target, self.eval(node.value, scope))
                elif isinstance(node, ast.NamedExpr):
                    self._bind(scope, node.target, self.eval(node.value, scope))
                elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                    self._bind(scope, node.target, self._elements(self.eval(node.iter, scope), node.iter))
                elif isinstance(node, (ast.With, ast.AsyncWith)):
                    for item in node.items:
                        if item.optional_vars is not None:
                            self._bind(scope, item.optional_vars, frozenset({("unknown", ast.unparse(item))}))
            if scope.names == before:
                return

    @staticmethod
    def _elements(values: frozenset, iterable: ast.AST) -> frozenset:
        out = set()
        for kind, payload in values:
            if kind == "seq":
                for element in payload:
                    out |= element
            else:
                out.add(("unknown", f"<item of {ast.unparse(iterable)}>"))
        return frozenset(out)

    # -- when_imported --

    def _find_registrations(self) -> None:
        for node in ast.walk(self.tree):
            if not (isinstance(node, ast.Call) and _called(node) == "when_imported"):
                continue
            if len(node.args) != 2:
                self.problems.append(f"{self.rel}:{node.lineno}: when_imported without (module, callback)")
                continue
            module = self.eval(node.args[0], self.module_scope)
            names = [payload for kind, payload in module if kind == "const" and isinstance(payload, str)]
            if len(names) != len(module) or not names:
                self.problems.append(f"{self.rel}:{node.lineno}: when_imported of a module this test cannot name")
                continue
            found = self._callback(node.args[1])
            if found is None:
                self.problems.append(f"{self.rel}:{node.lineno}: when_imported callback this test cannot read: "
                                     f"{ast.unparse(node.args[1])}")
                continue
            function, factory_params = found
            first = _parameters(function)[:1]
            for name in names:
                params = dict(factory_params)
                params.update({param: frozenset({(_kind_of_module(name), name)}) for param in first})
                self.readings.setdefault(function, []).append(params)

    def _callback(self, node: ast.AST):
        """(the function a registered callback runs, bindings of its factory's parameters) or None."""
        if isinstance(node, ast.Lambda):
            return node, {}
        if not isinstance(node, ast.Name):
            return None
        if node.id in self.defs:
            return self.defs[node.id], {}
        for statement in self.tree.body:  # name = factory(<constants>): the nested function it returns
            if (isinstance(statement, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id
                                                          for t in statement.targets)
                    and isinstance(statement.value, ast.Call) and isinstance(statement.value.func, ast.Name)
                    and statement.value.func.id in self.defs):
                factory = self.defs[statement.value.func.id]
                nested = {n.name: n for n in factory.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                returned = [n.value.id for n in factory.body if isinstance(n, ast.Return)
                            and isinstance(n.value, ast.Name) and n.value.id in nested]
                if len(returned) != 1:
                    return None
                args = [self.eval(arg, self.module_scope) for arg in statement.value.args]
                return nested[returned[0]], dict(zip(_parameters(factory), args, strict=False))
        return None

    # -- sites --

    def scan(self) -> None:
        self._scan_scope(self.module_scope, self.tree.body)

    def _scan_scope(self, scope: _Scope, body: list[ast.AST]) -> None:
        for node in _own_nodes(body):
            self._sites_at(node, scope)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                self._scan_function(node, scope)
            elif isinstance(node, ast.ClassDef):
                class_scope = _Scope(scope)  # methods see the enclosing scope, not the class body
                for statement in node.body:
                    self._scan_scope(class_scope, [statement])

    def _scan_function(self, node: ast.AST, outer: _Scope) -> None:
        unknown = {name: frozenset({("unknown", name)}) for name in _parameters(node)}
        for params in self.readings.get(node, [{}]):
            scope = _Scope(outer)
            body = [node.body] if isinstance(node, ast.Lambda) else node.body
            self._bind_scope(scope, body, {**unknown, **params})
            if isinstance(node, ast.FunctionDef) and node.name == "wrap_once" and self.rel.endswith("patches.py"):
                continue  # rule 2: the mechanism; each call of it is a site of rule 1
            self._scan_scope(scope, body)

    def _add(self, node: ast.AST, targets: list[str]) -> None:
        for target in targets:
            self.sites.add(Site(self.rel, target, node.lineno))

    def _sites_at(self, node: ast.AST, scope: _Scope) -> None:
        if isinstance(node, (ast.Attribute, ast.Name)) and isinstance(node.ctx, ast.Load):  # a read row's reference
            self.references |= {Site(self.rel, payload, node.lineno)
                                for kind, payload in self.eval(node, scope) if kind == "foreign"}
        if isinstance(node, ast.Call):
            self._call_site(node, scope)
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                for element in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]):
                    self._store_site(node, element, scope)

    def _call_site(self, node: ast.Call, scope: _Scope) -> None:
        called = _called(node)
        if called == "wrap_once" and len(node.args) >= 2:  # rule 1
            self._attribute_sites(node, node.args[0], node.args[1], scope)
        elif (called == "setattr" and isinstance(node.func, ast.Name)) or ast.unparse(node.func) == (
                "object.__setattr__"):  # rule 2
            if len(node.args) >= 2 and not _is_self(node.args[0]):
                values = self.eval(node.args[0], scope)
                if not all(kind == "own" for kind, _ in values):
                    self._attribute_sites(node, node.args[0], node.args[1], scope)
        else:  # rule 6
            for kind, name in self.eval(node.func, scope):
                last = name.rsplit(".", 1)[-1] if kind == "foreign" else ""
                if last == "register" or last.startswith("register_"):  # not registered_names
                    self._add(node, [name])

    def _attribute_sites(self, node: ast.Call, owner: ast.AST, attr: ast.AST, scope: _Scope) -> None:
        owners = self.eval(owner, scope)
        for kind, name in self.eval(attr, scope):
            name = str(name) if kind == "const" else f"<{ast.unparse(attr)}>"  # an attribute this test cannot name
            written = f"{ast.unparse(owner)}.{name}"
            values = frozenset(_attribute(value, name, written) for value in owners)
            self._add(node, self._targets(values, written))

    def _store_site(self, node: ast.AST, target: ast.AST, scope: _Scope) -> None:
        if not isinstance(target, (ast.Attribute, ast.Subscript)):
            return
        written = ast.unparse(target)
        root = target
        while isinstance(root, (ast.Attribute, ast.Subscript)):
            root = root.value
        if _is_self(root):
            return  # not a site: writes through self/cls
        base = self.eval(target.value, scope)
        if isinstance(target, ast.Subscript) and ("std", "sys.modules") in base:  # rule 3
            self._add(node, [f"sys.modules[{_key_text(self.eval(target.slice, scope), ast.unparse(target.slice))}]"])
            return
        values = self.eval(target, scope)
        foreign = [payload for kind, payload in values if kind == "foreign"]
        if foreign:  # rule 4
            self._add(node, sorted(set(foreign)))
        elif (isinstance(target, ast.Attribute) and target.attr.startswith("_") and not target.attr.endswith("__")
              and any(kind == "unknown" for kind, _ in base)):  # rule 5
            self._add(node, [written])


def _called(node: ast.Call) -> str | None:
    func = node.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _is_self(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in SELF


def _parameters(node: ast.AST) -> list[str]:
    args = node.args
    return [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]


# ---- the scanner -----------------------------------------------------------------------------------------------------


def patch_sites(files: list[Path], root: Path = ROOT, *, references: bool = False) -> tuple[list[Site], list[str]]:
    """The patch sites of ``files`` (paths under ``root``), and what the scanner could not read; with
    ``references``, also every read of another project's object (what a ``reads`` row of the table matches)."""
    sites: set[Site] = set()
    problems: list[str] = []
    for path in files:
        scanned = _File(path, root)
        scanned.scan()
        sites |= scanned.sites | (scanned.references if references else set())
        problems += scanned.problems
    return sorted(sites), problems


def row_key(row) -> tuple[str, str]:
    return row.module, row.seen_as or row.target


def unlisted(sites: list[Site], rows=PATCHES) -> list[Site]:
    keys = {row_key(row) for row in rows}
    return [site for site in sites if site.key() not in keys]


def stale(sites: list[Site], rows=PATCHES, references: list[Site] = ()) -> list:
    keys = {site.key() for site in sites}
    read = {site.key() for site in references}
    return [row for row in rows if row_key(row) not in (read if row.reads else keys)]


def _pack_files() -> list[Path]:
    return sorted(path for folder in SCANNED for path in (ROOT / folder).rglob("*.py"))


# ---- the table against the code --------------------------------------------------------------------------------------


def test_every_patch_is_a_row_of_the_table():
    sites, problems = patch_sites(_pack_files())
    assert not problems, "\n".join(problems)
    missing = unlisted(sites)
    assert not missing, (
        "patches that recipes/verl_ext/patch_table.py does not name (add a row: module, target, change, why, the "
        "version read against):\n" + "\n".join(f"{s.module}:{s.line}: {s.target}" for s in missing)
    )


def test_every_row_of_the_table_is_a_patch_the_code_makes():
    sites, _ = patch_sites(_pack_files())
    references, _ = patch_sites(_pack_files(), references=True)
    rows = stale(sites, references=references)
    assert not rows, (
        "rows of recipes/verl_ext/patch_table.py that no code makes (remove them, or fix the target):\n"
        + "\n".join(f"{row.module}: {row_key(row)[1]}" for row in rows)
    )


def test_one_row_per_target_and_every_field_filled():
    keys = [row_key(row) for row in PATCHES]
    assert len(keys) == len(set(keys)), sorted(key for key in keys if keys.count(key) > 1)
    for row in PATCHES:
        assert all((row.module, row.target, row.change, row.why, row.read_against)), row
        assert (ROOT / row.module).is_file(), row.module


def test_each_row_names_the_version_it_was_read_against():
    assert {row.read_against for row in rows_for("verl")} == {f"verl {SUPPORTED_VERL}"}
    for package, version in SUPPORTED_MEGATRON.items():
        assert {row.read_against for row in rows_for(package)} == {f"{package} {version}"}
    for row in PATCHES:
        package, version = row.read_against.rsplit(" ", 1)
        try:
            installed = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue  # megatron-core, mbridge: GPU extras (the version is their pin above)
        assert installed == version, (
            f"{package} {installed} is installed, the patch of {row.target} ({row.module}) was read against "
            f"{version}: read the patched code again and update the row")


# ---- the scanner on small modules ------------------------------------------------------------------------------------


def _scan(tmp_path: Path, source: str, name: str = "recipes/new_module.py") -> list[str]:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    sites, problems = patch_sites([path], tmp_path)
    assert not problems, problems
    return [site.target for site in sites]


def test_a_new_patch_is_reported_as_missing_from_the_table(tmp_path):
    path = tmp_path / "recipes" / "verl_ext" / "api.py"  # a file with rows, and one patch more
    path.parent.mkdir(parents=True)
    path.write_text((ROOT / "recipes/verl_ext/api.py").read_text() + "\n\nimport ray\nray.shutdown = print\n")
    sites, _ = patch_sites([path], tmp_path)
    assert [(site.module, site.target) for site in unlisted(sites)] == [("recipes/verl_ext/api.py", "ray.shutdown")]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        # rule 4: imports, aliases, from-imports, items; rule 3: sys.modules
        ("import ray\nray.init = print\n", ["ray.init"]),
        ("import torch.nn.functional as F\ndef f():\n    F.relu = abs\n", ["torch.nn.functional.relu"]),
        ("def f():\n    from omegaconf import OmegaConf  # lazy: x\n    OmegaConf.x += 1\n", ["omegaconf.OmegaConf.x"]),
        ("import verl.a\ndel verl.a.b['k']\n", ["verl.a.b['k']"]),
        ("import sys\nK = 'vllm'\nsys.modules[K] = None\n", ["sys.modules['vllm']"]),
        ("import sys\ndef f():\n    m = sys.modules.get('transfer_queue.interface')\n    m._S = None\n",
         ["transfer_queue.interface._S"]),
        ("import importlib\nNAMES = ('omegaconf.base', 'omegaconf._utils')\n"
         "for n in NAMES:\n    importlib.import_module(n).parse = id\n",
         ["omegaconf._utils.parse", "omegaconf.base.parse"]),
        # when_imported: a callback's first parameter is the module; a lambda; a factory's nested function
        ("from recipes.p import when_imported, wrap_once\ndef cb(mod):\n    c = mod.C\n    c.x = 1\n"
         "    for k in (mod.A, mod.B):\n        wrap_once(k, 'f', 'm', id)\n"
         "when_imported('verl.m', cb)\nwhen_imported('verl.n', cb)\n",
         ["verl.m.A.f", "verl.m.B.f", "verl.m.C.x", "verl.n.A.f", "verl.n.B.f", "verl.n.C.x"]),
        ("from recipes.p import when_imported\nwhen_imported('verl.r', lambda r: r.Registry.register('x', id))\n",
         ["verl.r.Registry.register"]),
        ("from recipes.p import when_imported, wrap_once\ndef make(name):\n    def patch(mod):\n"
         "        wrap_once(getattr(mod, name), 'g', 'm', id)\n    return patch\n"
         "P = make('E')\nwhen_imported('verl.e', P)\n", ["verl.e.E.g"]),
        # rule 2: setattr on another project's class (names from a loop), or on an object verl hands in
        ("import verl.w as w\nfor name, fn in (('a', id), ('b', id)):\n    setattr(w.T, name, fn)\n",
         ["verl.w.T.a", "verl.w.T.b"]),
        ("def f(config):\n    object.__setattr__(config, 'coef', 1.0)\n", ["config.coef"]),
        # rule 5: a private attribute of an object handed in
        ("def wrap(original):\n    def step(self, batch):\n        batch._device = None\n    return step\n",
         ["batch._device"]),
        # not sites: self, the pack's own objects, objects the pack made, public attributes, the standard library
        ("import verl\nclass A:\n    def m(self):\n        self.x = 1\n        self._y = 2\n"
         "        object.__setattr__(self, 'z', 3)\n", []),
        ("class S:\n    pass\ndef d():\n    pass\nfor n in ('a', 'b'):\n    setattr(S, n, d)\nd._mark = True\n", []),
        ("from omegaconf import OmegaConf\ndef f(cfg):\n    c = OmegaConf.create({})\n    c.x = 1\n    cfg.y = 2\n",
         []),
        ("import os, sys\nos.environ['A'] = '1'\nsys.meta_path.insert(0, None)\nsys.argv[1:] = []\n", []),
        ("import atexit, gc\natexit.register(gc.freeze)\n", []),
    ],
)
def test_the_scanner(tmp_path, source, expected):
    assert _scan(tmp_path, source) == expected


def test_a_callback_the_scanner_cannot_read_is_a_failure(tmp_path):
    path = tmp_path / "recipes" / "m.py"
    path.parent.mkdir(parents=True)
    path.write_text("from recipes.p import when_imported\nwhen_imported('verl.x', CALLBACKS[0])\n")
    _, problems = patch_sites([path], tmp_path)
    assert problems and "cannot read" in problems[0]
