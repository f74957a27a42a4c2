"""The package's layers, read from the source: imports point down only, and never in a circle.

Every import counts, at the top of a module or inside a function: each is an arrow a reader
has to follow. Imports made for type checking only (``if TYPE_CHECKING:``) count for the
direction of the arrows too, but not for circles: they never run, and a module may name in an
annotation the type of what it makes (``AlgorithmConfig.build() -> Algorithm``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).parents[1] / "src"
PACKAGE = SRC / "rlserve"

LAYERS: list[set[str]] = [
    {"errors", "version"},
    {"protocol", "policy"},
    {"config", "experience", "processes", "run"},
    {"learners", "env"},
    {"training"},
    {"server", "client"},
    {"cluster"},
    {"algorithm"},
    {"cli"},
]
"""Bottom to top: a package imports only from the layers below its own (and from itself)."""

FRONT_DOOR = "rlserve"
"""``rlserve/__init__.py``: it re-exports the public surface, and nothing inside imports it."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _type_checking_nodes(tree: ast.Module) -> set[ast.AST]:
    """The statements inside ``if TYPE_CHECKING:`` blocks."""
    inside: set[ast.AST] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) in TYPE_CHECKING_TESTS:
            for statement in node.body:
                inside.update(ast.walk(statement))
    return inside


TYPE_CHECKING_TESTS = {"TYPE_CHECKING", "typing.TYPE_CHECKING"}


def _imports(
    name: str, path: Path, modules: dict[str, Path], *, type_only: bool = True
) -> Iterator[str]:
    """Yield the rlserve modules ``name`` imports (``from a import b``: ``a.b`` when a module).

    ``type_only=False`` leaves out the imports inside ``if TYPE_CHECKING:``.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skipped = set() if type_only else _type_checking_nodes(tree)
    for node in ast.walk(tree):
        if node in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            if target in modules and target != name:
                yield target


def _graph(*, type_only: bool = True) -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: set(_imports(name, path, modules, type_only=type_only))
        for name, path in modules.items()
    }


def _top_package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else FRONT_DOOR


def _layer_of(package: str) -> int:
    for index, layer in enumerate(LAYERS):
        if package in layer:
            return index
    raise AssertionError(f"rlserve.{package} is in no layer: add it to LAYERS in {__file__}")


def test_only_the_front_door_errors_and_version_sit_at_the_top() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "errors.py", "version.py"]


def test_imports_point_down_only() -> None:
    upward = []
    for module, targets in _graph().items():
        if module == FRONT_DOOR:
            continue
        here = _top_package(module)
        for target in targets:
            there = _top_package(target)
            if there == FRONT_DOOR:
                upward.append(f"{module} imports the front door (import from the module instead)")
            elif there != here and _layer_of(there) >= _layer_of(here):
                upward.append(f"{module} -> {target}")
    assert not upward, "imports that do not point down:\n" + "\n".join(sorted(upward))


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_in_a_circle() -> None:
    cycles = [sorted(c) for c in _cycles(_graph(type_only=False))]
    assert not cycles, f"import cycles: {cycles}"


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]


def test_the_client_never_needs_the_server_side() -> None:
    server_side = {"server", "training", "learners", "algorithm", "run", "env", "cli"}
    reached: set[str] = set()
    graph = _graph()
    todo = [m for m in graph if _top_package(m) == "client"]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo.extend(graph[module])
    assert not {m for m in reached if _top_package(m) in server_side}
