"""The house's import graph has no circle, counting the imports inside functions too: a module
that needs another at call time still depends on it (docs/design.md, "Who depends on whom")."""

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("labrun", "flows", "phases")


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(tree: ast.Module) -> list[str]:
    """Every module name an import statement names, outside `if TYPE_CHECKING:` blocks."""
    for_types = {id(n) for block in ast.walk(tree)
                 if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
                 for statement in block.body for n in ast.walk(statement)}
    names = []
    for node in ast.walk(tree):
        if id(node) in for_types:
            continue
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names += [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
    return names


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules it imports, with each package whose `__init__` that import runs."""
    known = modules()
    graph = {name: set() for name in known}
    for name, path in known.items():
        for target in imported(ast.parse(path.read_text())):
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
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_module_depends_on_itself_through_others():
    assert circles(import_graph()) == []
