"""The package's import graph keeps its layers: no import cycles, and arrows point down the stack
front ends -> engine -> runner -> models -> layers -> kernels. Imports are read with ``ast``
(module level, inside functions, and under ``TYPE_CHECKING``), so nothing is imported here."""

from __future__ import annotations

import ast
from pathlib import Path

import kvserve

ROOT = Path(kvserve.__file__).parent

# The stack, lowest first. A module may import from its own rank or lower ones only.
# engine.core (bookkeeping: requests, scheduler, block pool, radix cache) sits at the bottom:
# the runner reads its plans, and it imports nothing ranked and no tensor library.
RANKS = {
    "kvserve.engine.core": 0,
    "kvserve.kernels": 1,
    "kvserve.layers": 2,
    "kvserve.models": 3,
    "kvserve.engine.runner": 4,
    "kvserve.engine": 5,  # the engine core loop and the offline front end
    "kvserve.engine.ipc": 6,
    "kvserve.server": 7,
    "kvserve.cli": 8,
}
# Modules every layer may import; they import nothing ranked.
FOUNDATION = ("kvserve.errors", "kvserve.config", "kvserve.kv_layout")
# Cycles tolerated while their owner breaks them; a new cycle fails the test. (quant's
# registry <-> checkpoint_config one is gone: the scheme types moved to quant/schemes.py.)
KNOWN_CYCLES: list[list[str]] = []


def _modules() -> dict[str, Path]:
    mods = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(path: Path, mods: dict[str, Path], type_checking: bool) -> set[str]:
    """kvserve modules ``path`` imports (``from pkg import mod`` counts as importing mod)."""

    def owner(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    found: set[str] = set()
    stack: list[ast.AST] = [ast.parse(path.read_text())]
    while stack:
        node = stack.pop()
        if _is_type_checking_block(node) and not type_checking:
            continue
        if isinstance(node, ast.Import):
            found |= {owner(a.name) for a in node.names if a.name.startswith("kvserve")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            module = node.module or ""
            if module.startswith("kvserve"):
                for alias in node.names:
                    full = f"{module}.{alias.name}"
                    found.add(full if full in mods else owner(module))
        stack.extend(ast.iter_child_nodes(node))
    return found


def _rank(module: str) -> tuple[str, int] | None:
    """The longest ranked package that holds ``module``."""
    best = None
    for package, rank in RANKS.items():
        if (module == package or module.startswith(package + ".")) and (
            best is None or len(package) > len(best[0])
        ):
            best = (package, rank)
    return best


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycles() -> None:
    """Type-only imports (under ``TYPE_CHECKING``) do not run, so they cannot form a cycle."""
    mods = _modules()
    graph = {m: _imports(p, mods, type_checking=False) - {m} for m, p in mods.items()}
    assert [c for c in _cycles(graph) if c not in KNOWN_CYCLES] == []


def test_imports_point_down_the_stack() -> None:
    mods = _modules()
    upward = []
    for module, path in mods.items():
        mine = _rank(module)
        for target in _imports(path, mods, type_checking=True):
            theirs = _rank(target)
            if module in FOUNDATION and theirs is not None:
                upward.append(f"{module} -> {target} (a foundation module)")
            elif mine and theirs and theirs[1] > mine[1]:
                upward.append(f"{module} ({mine[0]}) -> {target} ({theirs[0]})")
    assert upward == []


def test_engine_core_is_bookkeeping_without_tensors() -> None:
    for path in (ROOT / "engine" / "core").glob("*.py"):
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        assert not [n for n in names if n.split(".")[0] in ("torch", "numpy")], path.name


def test_the_checker_sees_a_cycle_and_an_upward_import() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _rank("kvserve.engine.runner.kv_pool") == ("kvserve.engine.runner", 4)
    assert _rank("kvserve.engine.llm") == ("kvserve.engine", 5)
    mods = _modules()
    runner = _imports(mods["kvserve.engine.runner.model_runner"], mods, type_checking=True)
    assert "kvserve.engine.runner.kv_pool" in runner and "kvserve.models.registry" in runner
