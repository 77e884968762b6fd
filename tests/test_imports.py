"""The house's import graph has no circle, counting the imports inside functions too: a module
that needs another at call time still depends on it (docs/design.md, "Who depends on whom")."""

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def packages() -> dict[str, Path]:
    """Each package's folder, from pyproject.toml's package-dir: phases/ is `labrun.phases`."""
    return {name: REPO / folder for name, folder in
            tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].items()}


def modules() -> dict[str, Path]:
    """Every module of the house, under the name the code imports it by."""
    found = {}
    for package, folder in packages().items():
        for path in folder.rglob("*.py"):
            parts = (*package.split("."), *path.relative_to(folder).with_suffix("").parts)
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(tree: ast.Module, package: str) -> list[str]:
    """Every module name an import statement names, outside `if TYPE_CHECKING:` blocks; a
    relative import's as an absolute name, from `package`, the module's own."""
    for_types = {id(n) for block in ast.walk(tree)
                 if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                 for statement in block.body for n in ast.walk(statement)}
    names = []
    for node in ast.walk(tree):
        if id(node) in for_types:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1]) if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            names += [f"{module}.{alias.name}" for alias in node.names] + [module]
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports, with each package whose `__init__` that import runs."""
    known = modules()
    graph = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for target in imported(ast.parse(path.read_text()), package):
            while target and target not in known:
                target = target.rpartition(".")[0]
            while target and target not in ("labrun", name) and not name.startswith(target + "."):
                if target in known:
                    graph[name].add(target)
                target = target.rpartition(".")[0]
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on_stack.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_imports_inside_functions_and_through_packages():
    graph = import_graph()
    assert "labrun.turns" in graph["labrun.agents.backends"]
    assert "labrun.agents" in graph["labrun.prompts"]  # through labrun.agents.registry
    # phases/ and flows/ under the names the code imports them by, and every module of each
    assert "labrun.phases.phase" in graph["labrun.flows.session"]
    assert "labrun.paper" in graph["labrun.phase_registry"]
    assert len(modules()) == len({path for folder in packages().values() for path in folder.rglob("*.py")})
    # a relative import, resolved from the module's package
    relative = ast.parse("from . import rules\nfrom ..state import Attempt")
    assert set(imported(relative, "labrun.phases")) >= {"labrun.phases.rules", "labrun.state.Attempt"}
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_depends_on_itself_through_others():
    assert circles(import_graph()) == []


def reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for w in graph.get(todo.pop(), ()):
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def test_the_phase_registry_and_its_rules_stand_apart_from_the_prefect_tasks():
    """The registry is read by everything (`labrun status` included), so it reaches neither
    the phases' Prefect tasks nor a session; only the tasks import the registry."""
    graph = import_graph()
    for name in ("labrun.phase_registry", "labrun.phase_registry.rules"):
        reached = reach(graph, name)
        assert not {m for m in reached if m.startswith(("labrun.phases", "labrun.flows", "labrun.session"))}, name
    assert "labrun.phase_registry" in graph["labrun.phases.phase"]
