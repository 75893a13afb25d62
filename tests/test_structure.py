"""The shape of the package, checked from its source: what a newcomer reads in the folder listing
is what the imports do.

* Layers: the shared types and errors at the bottom, then the protocol model, the providers,
  the guard and the hand-off, and the tools (CLI, simulator, testing) on top. A module never
  imports from a layer above its own, so the model can be read without the providers and the
  providers without the guard.
* No import cycles, counting imports inside functions (a deferred import is still a
  dependency); only imports under ``if TYPE_CHECKING:`` are left out.
* No private name (``_x``) imported from, or read off, another module: what crosses a module
  boundary is public and documented where it is defined.
* No module over ``MAX_LINES`` lines; no ``assert`` where a Lambda function runs (``python -O``
  strips them, so a check that matters raises instead); no ``isinstance`` on the providers'
  base class outside the providers (a backend from another package need not subclass it).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "leaseguard"
MAX_LINES = 400

# Lowest first. A module's layer is the first prefix that matches its dotted name.
LAYERS: list[tuple[str, ...]] = [
    ("leaseguard.types", "leaseguard.errors", "leaseguard.lazy", "leaseguard.aws"),
    ("leaseguard.validation", "leaseguard.signals", "leaseguard.events"),
    (
        "leaseguard.protocol.state",
        "leaseguard.protocol.operators",
        "leaseguard.protocol.transitions",
        "leaseguard.protocol.model",
    ),
    ("leaseguard.providers", "leaseguard.config", "leaseguard.contract"),
    (
        "leaseguard.renewal",
        "leaseguard.renewer",
        "leaseguard.observability",
        "leaseguard.handoff",
        "leaseguard.stacking",
        "leaseguard.batch",
        "leaseguard.guard",
    ),
    ("leaseguard.protocol", "leaseguard.cli", "leaseguard.simulate", "leaseguard.testing"),
    ("leaseguard", "leaseguard.__main__"),
]

# Where a Lambda function never runs: developer tools, which may assert their own invariants.
TOOLS = ("leaseguard.protocol", "leaseguard.testing", "leaseguard.simulate")
RUNTIME_PROTOCOL = (
    "leaseguard.protocol.state",
    "leaseguard.protocol.operators",
    "leaseguard.protocol.transitions",
    "leaseguard.protocol.model",
)


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module
    imports: set[str] = field(default_factory=set)
    private: list[str] = field(default_factory=list)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load() -> dict[str, Module]:
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        modules[name] = Module(name, path, ast.parse(path.read_text(), str(path)))
    for module in modules.values():
        _ImportVisitor(module, modules).visit(module.tree)
    return modules


class _ImportVisitor(ast.NodeVisitor):
    def __init__(self, module: Module, modules: dict[str, Module]) -> None:
        self.module = module
        self.modules = modules
        self.aliases: set[str] = set()  # local names bound to leaseguard modules

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.name in self.modules:
                self.module.imports.add(alias.name)
                if alias.asname:
                    self.aliases.add(alias.asname)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = self._base(node)
        if base is None or not base.startswith("leaseguard"):
            return
        for alias in node.names:
            full = f"{base}.{alias.name}"
            if full in self.modules:  # `from package import module`
                self.module.imports.add(full)
                self.aliases.add(alias.asname or alias.name)
                continue
            if base in self.modules:
                self.module.imports.add(base)
            if _is_private(alias.name) and base != self.module.name:
                self.module.private.append(f"from {base} import {alias.name}")

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if (
            isinstance(node.value, ast.Name)
            and node.value.id in self.aliases
            and _is_private(node.attr)
        ):
            self.module.private.append(f"{node.value.id}.{node.attr}")
        self.generic_visit(node)

    def _base(self, node: ast.ImportFrom) -> str | None:
        if not node.level:
            return node.module
        package = self.module.name.split(".")
        if self.module.path.name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)]
        return ".".join(package + ([node.module] if node.module else []))


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def layer_of(name: str) -> int:
    best, length = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            matches = name == prefix or name.startswith(prefix + ".")
            if matches and len(prefix) > length:
                best, length = index, len(prefix)
    assert best >= 0, f"{name} is in no layer: add it to LAYERS"
    return best


MODULES = load()


def test_every_module_has_a_layer_and_imports_only_from_its_own_or_lower() -> None:
    upward = [
        f"{m.name} (layer {layer_of(m.name)}) imports {target} (layer {layer_of(target)})"
        for m in MODULES.values()
        for target in sorted(m.imports)
        if layer_of(target) > layer_of(m.name)
        and not m.name.startswith(target + ".")  # a package's own __init__
        and not target.startswith(m.name + ".")  # a package re-exporting its modules
    ]
    assert not upward, "\n".join(upward)


def cycles(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(v: str) -> Iterator[list[str]]:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                yield from visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                yield sorted(component)

    for v in sorted(graph):
        if v not in index:
            yield from visit(v)


def test_no_import_cycles() -> None:
    # A package __init__ that re-exports its own modules is not a cycle: Python runs the
    # package first whichever module is imported.
    graph = {
        m.name: {t for t in m.imports if not t.startswith(m.name + ".") and t != m.name}
        for m in MODULES.values()
    }
    found = list(cycles(graph))
    assert not found, found


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert list(cycles(graph)) == [["a", "b", "c"]]


def test_no_private_names_cross_modules() -> None:
    crossing = [f"{m.name}: {p}" for m in MODULES.values() for p in m.private]
    assert not crossing, "\n".join(crossing)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_size(name: str) -> None:
    lines = len(MODULES[name].path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by purpose"


def test_no_assert_where_lambda_runs() -> None:
    found = [
        f"{m.name}:{node.lineno}"
        for m in MODULES.values()
        if not m.name.startswith(TOOLS) or m.name.startswith(RUNTIME_PROTOCOL)
        for node in ast.walk(m.tree)
        if isinstance(node, ast.Assert)
    ]
    assert not found, found


def test_core_code_never_asks_for_the_base_class() -> None:
    found = [
        f"{m.name}:{node.lineno}"
        for m in MODULES.values()
        if not m.name.startswith(("leaseguard.providers", "leaseguard.testing"))
        for node in ast.walk(m.tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("isinstance", "issubclass")
        and "BaseLeaseProvider" in ast.unparse(node)
    ]
    assert not found, found
