"""Print mcpd's module graph: its process packages, the import arrows between them, any import
cycle, root's line count, and the modules one privileged call passes through.

    python scripts/modgraph.py                        # packages, arrows, cycles, root's lines
    python scripts/modgraph.py --path files/read      # the route of a privileged files/read
    python scripts/modgraph.py --repo DIR             # another checkout (its mcpd/ and tests/)

Everything is read from the source with :mod:`ast` (standard library only, no network, nothing
of mcpd is imported or run). An import counts wherever it stands, inside a function too (it runs
when the function is called); one under ``if TYPE_CHECKING:`` does not (it never runs), and is
shown apart. A cycle is a strongly connected set of modules (Tarjan), so one found here is a
cycle at run time: each is printed with one loop through it, ``file:line`` for every arrow.
Root's lines are counted as ``tests/unit/test_root_surface.py`` counts them
(:func:`tests.support.codelines.code_lines`, over ``mcpd/helper/``).

``--path OP``: the privileged route of ``OP`` (``files/read-privileged`` is taken as
``files/read``) found from the request tables and the sends: the front module that sends the
policy process its ``privileged_call``; the policy's table entry and handler for it; on the
shortest chain of calls from that handler, the module that sends root its ``open`` (or ``walk``
for ``files/list``/``files/find``); root's table entry and handler, and the opener it calls;
then the module that hands the descriptor to the worker and the worker's module that serves
``OP``. Calls are resolved by name (a function or method of that name in the process's own
modules), which is enough to find the one route that exists.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("admin", "client", "common", "core", "front", "helper", "policy", "walker", "worker")
ROOT_FOLDER = "mcpd/helper"


@dataclass
class Module:
    """One source file: its name, path, and its imports of mcpd modules."""

    name: str
    path: Path
    tree: ast.Module
    runtime: list[tuple[str, int]] = field(default_factory=list)  # (imported mcpd module, line)
    typing_only: list[tuple[str, int]] = field(default_factory=list)


def module_name(repo: Path, path: Path) -> str:
    parts = list(path.relative_to(repo).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def type_checking_lines(tree: ast.Module) -> set[int]:
    """The lines of every statement inside an ``if TYPE_CHECKING:`` block."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                lines.update(range(inner.lineno, (inner.end_lineno or inner.lineno) + 1))
    return lines


def load(repo: Path) -> dict[str, Module]:
    """Every module of ``repo``'s ``mcpd/`` with its imports resolved to mcpd modules (an
    ``from X import Y`` names ``X.Y`` when that is a module, else ``X``)."""
    paths = sorted(p for p in (repo / "mcpd").rglob("*.py") if "share" not in p.relative_to(repo).parts)
    mods = {module_name(repo, p): Module(module_name(repo, p), p, ast.parse(p.read_text(encoding="utf-8"))) for p in paths}
    for mod in mods.values():
        typing = type_checking_lines(mod.tree)
        base = mod.name.split(".") if mod.path.name == "__init__.py" else mod.name.split(".")[:-1]
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                where = node.module or ""
                if node.level:
                    where = ".".join(base[: len(base) - node.level + 1] + ([where] if where else []))
                targets = [f"{where}.{a.name}" if f"{where}.{a.name}" in mods else where for a in node.names]
            else:
                continue
            for target in dict.fromkeys(t for t in targets if t in mods and t != mod.name):
                (mod.typing_only if node.lineno in typing else mod.runtime).append((target, node.lineno))
    return mods


def package(name: str) -> str:
    """``mcpd.front.mcp.session`` -> ``front``; ``mcpd`` itself -> ``mcpd``."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "mcpd"


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one node (or a node with an arrow to itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    top = stack.pop()
                    on.discard(top)
                    members.append(top)
                    if top == node:
                        break
                if len(members) > 1 or node in graph.get(node, ()):
                    found.append(sorted(members))
    return found


def loop_through(members: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One loop from the first member back to it, inside ``members`` (breadth first)."""
    inside, start = set(members), members[0]
    back: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node] & inside):
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(back[path[-1]])
                return [*reversed(path), start]
            if child not in back:
                back[child] = node
                queue.append(child)
    return members


def root_lines(repo: Path) -> int:
    """Root's folder's code lines, counted by the budget test's own counter."""
    sys.path.insert(0, str(repo))
    from tests.support.codelines import code_lines

    return sum(code_lines(p.read_text(encoding="utf-8")) for p in sorted((repo / ROOT_FOLDER).rglob("*.py")))


def report(repo: Path, mods: dict[str, Module]) -> list[str]:
    """The packages, the arrows between them, the cycles and root's line count, as lines."""
    out = ["packages (modules, physical lines):"]
    for pkg in PACKAGES:
        own = [m for m in mods.values() if package(m.name) == pkg]
        lines = sum(len(m.path.read_text(encoding="utf-8").splitlines()) for m in own)
        out.append(f"  {pkg:<8} {len(own):4d} modules {lines:7d} lines")
    arrows: Counter[tuple[str, str]] = Counter()
    for mod in mods.values():
        for target, _ in mod.runtime:
            if package(mod.name) != package(target) and package(target) != "mcpd":
                arrows[(package(mod.name), package(target))] += 1
    out += ["", "arrows between packages (imports, function-level included; A -> B: A imports B):"]
    out += [f"  {a:<8} -> {b:<8} {n:4d}" for (a, b), n in sorted(arrows.items())]
    graph = {m.name: {t for t, _ in m.runtime} for m in mods.values()}
    where = {(m.name, t): line for m in mods.values() for t, line in m.runtime}
    package_graph: dict[str, set[str]] = defaultdict(set)
    for a, b in arrows:
        package_graph[a].add(b)
    out += ["", "cycles between packages:"]
    out += [f"  {' -> '.join(loop_through(c, package_graph))}" for c in cycles(dict(package_graph))] or ["  none"]
    out += ["", "cycles between modules (at run time):"]
    for members in cycles(graph):
        loop = loop_through(members, graph)
        steps = [f"{a} -> {b} ({mods[a].path.relative_to(repo)}:{where[(a, b)]})" for a, b in zip(loop, loop[1:])]
        out += [f"  {len(members)} modules: " + ", ".join(members), *(f"    {s}" for s in steps)]
    if not cycles(graph):
        out.append("  none")
    typing = sorted((m.name, t) for m in mods.values() for t, _ in m.typing_only)
    out += ["", f"type-only imports (under TYPE_CHECKING, never run): {len(typing)}"]
    out += ["", f"root's folder ({ROOT_FOLDER}/, code lines as the budget counts them): {root_lines(repo)}"]
    return out


# ------------------------------------------------------------------ --path


@dataclass(frozen=True)
class Function:
    module: str
    name: str  # qualified: "f" or "Class.f"
    node: ast.FunctionDef | ast.AsyncFunctionDef


def functions(mods: dict[str, Module]) -> list[Function]:
    found: list[Function] = []
    for mod in mods.values():
        for node in mod.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append(Function(mod.name, node.name, node))
            elif isinstance(node, ast.ClassDef):
                found += [Function(mod.name, f"{node.name}.{f.name}", f) for f in node.body
                          if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return found


def called_names(node: ast.AST) -> set[str]:
    """The bare names of everything ``node`` calls (``f()``, ``x.f()``) or hands on (``f`` as an
    argument, or as a value of a dict it builds: a table of handlers)."""
    names: set[str] = set()
    for sub in ast.walk(node):
        targets = [sub.func, *sub.args, *(k.value for k in sub.keywords)] if isinstance(sub, ast.Call) else \
            [v for v in sub.values if v is not None] if isinstance(sub, ast.Dict) else []
        for target in targets:
            if isinstance(target, ast.Name):
                names.add(target.id)
            elif isinstance(target, ast.Attribute):
                names.add(target.attr)
    return names


def dispatch_table(mods: dict[str, Module], op: str, scopes: tuple[str, ...]) -> tuple[str, str, str] | None:
    """(module, table name, handler) of a module-level ``NAME = {op: handler, ...}`` in ``scopes``."""
    for mod in (m for m in mods.values() if package(m.name) in scopes):
        for node in mod.tree.body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
                target = node.targets[0] if isinstance(node, ast.Assign) else node.target
                for k, v in zip(node.value.keys, node.value.values):
                    if isinstance(k, ast.Constant) and k.value == op and isinstance(target, ast.Name):
                        return mod.name, target.id, ast.unparse(v)
    return None


def sends(node: ast.AST, kind: str) -> bool:
    """Whether ``node`` builds a request of type ``kind``: ``{"type": kind, ...}``, ``dict(..., type=kind)``
    or a call whose first argument is the string ``kind`` (``root.call("open", ...)``)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "type" and isinstance(v, ast.Constant) and v.value == kind
                for k, v in zip(sub.keys, sub.values)):
            return True
        if isinstance(sub, ast.Call) and (
                any(k.arg == "type" and isinstance(k.value, ast.Constant) and k.value.value == kind for k in sub.keywords)
                or (sub.args and isinstance(sub.args[0], ast.Constant) and sub.args[0].value == kind
                    and isinstance(sub.func, ast.Attribute) and sub.func.attr in ("call", "request", "ask", "_ask"))):
            return True
    return False


def served(mods: dict[str, Module], kind: str) -> tuple[str, str, str] | None:
    """(module, table name, handler) of the ``Request(kind, keys, handler, ...)`` entry serving
    ``kind`` in a module-level ``TABLE = table(...)``."""
    for mod in mods.values():
        for node in mod.tree.body:
            if not (isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name)):
                continue
            for call in ast.walk(node.value):
                if (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "Request"
                        and len(call.args) >= 3 and isinstance(call.args[0], ast.Constant) and call.args[0].value == kind):
                    return mod.name, node.targets[0].id, ast.unparse(call.args[2])
    return None


def chain(funcs: list[Function], start: Function, goal: Callable[[Function], bool], scopes: tuple[str, ...]) -> list[Function]:
    """The shortest chain of calls from ``start`` to a function for which ``goal`` holds, through
    the functions of the packages ``scopes`` (``common`` too)."""
    by_name: dict[str, list[Function]] = defaultdict(list)
    for f in funcs:
        if package(f.module) in (*scopes, "common"):
            by_name[f.name.rsplit(".", 1)[-1]].append(f)
    back: dict[Function, Function | None] = {start: None}
    queue = deque([start])
    while queue:
        here = queue.popleft()
        if goal(here):
            path = [here]
            while (prev := back[path[-1]]) is not None:
                path.append(prev)
            return path[::-1]
        for name in sorted(called_names(here.node)):
            for f in by_name.get(name, ()):
                if f not in back:
                    back[f] = here
                    queue.append(f)
    return []


def holds(node: ast.AST, value: str) -> bool:
    """Whether ``node`` holds the string constant or the name ``value``."""
    return any(isinstance(s, ast.Constant) and s.value == value or isinstance(s, ast.Attribute) and s.attr == value
               or isinstance(s, ast.Name) and s.id == value for s in ast.walk(node))


def hop(process: str, steps: list[Function], what: str) -> str:
    """One line of the route: the modules of ``steps`` in order, then the functions and ``what``."""
    modules = " -> ".join(dict.fromkeys(f.module for f in steps)) or "(not found)"
    return f"  {process:<7} {modules}\n  {'':<7}   {' -> '.join(f.name for f in steps)}: {what}"


def route(mods: dict[str, Module], op: str) -> list[str]:
    """The modules a privileged ``op`` passes through, process by process (see the module docstring)."""
    op = op.removesuffix("-privileged")
    funcs = functions(mods)
    find = {(f.module, f.name): f for f in funcs}
    out = [f"privileged {op}, from the front's tools/call to the worker that answers:"]
    method = next((v.attr if isinstance(v, ast.Attribute) else getattr(v, "id", "") for f in funcs
                   if package(f.module) == "front" for d in ast.walk(f.node) if isinstance(d, ast.Dict)
                   for k, v in zip(d.keys, d.values) if isinstance(k, ast.Constant) and k.value == "tools/call"), "")
    entry = next((f for f in funcs if package(f.module) == "front" and f.name.rsplit(".", 1)[-1] == method), None)
    steps = chain(funcs, entry, lambda f: sends(f.node, "privileged_call"), ("front",)) if entry else []
    out.append(hop("front", steps, "sends the policy process privileged_call"))
    table, name, handler = served(mods, "privileged_call") or ("?", "?", "?")
    start = next((f for f in funcs if package(f.module) == "policy" and f.name == handler), None)
    goal = "walk" if op in ("files/list", "files/find") else "open"
    steps = chain(funcs, start, lambda f: sends(f.node, goal), ("policy",)) if start else []
    out.append(hop("policy", [Function(table, f"{name}[privileged_call]", start.node)] + steps if start else [],
                   f"the table's handler, which asks root to {goal}"))
    table, name, handler = served(mods, goal) or ("?", "?", "?")
    serve = find.get((table, handler.split(".")[-1])) or find.get((table, handler))
    opens = (lambda f: holds(f.node, "syscall")) if goal == "open" else (lambda f: f.module.endswith(".forkserver"))
    steps = chain(funcs, serve, opens, ("helper",)) if serve else []
    out.append(hop("root", [Function(table, f"{name}[{goal}]", serve.node)] + steps if serve else [],
                   "opens the path once (openat2) and checks the descriptor" if goal == "open" else "has the fork server fork a walker"))
    if goal == "open":
        steps = chain(funcs, start, lambda f: holds(f.node, "SCM_RIGHTS"), ("policy",)) if start else []
        out.append(hop("policy", steps, "hands the descriptor root opened to the caller's worker"))
    if goal == "walk":
        walker, ops = find.get(("mcpd.walker.main", "main")), dispatch_table(mods, op, ("walker",))
        steps = chain(funcs, walker, lambda f: ops is not None and holds(f.node, ops[1]), ("walker",)) if walker else []
        out.append(hop("walker", steps, f"walks for {op} ({ops[1] if ops else '?'}[{op!r}]: {ops[2] if ops else '?'})"))
        return out
    ops = dispatch_table(mods, op, ("worker", "core"))
    worker = find.get(("mcpd.worker.main", "main"))
    steps = chain(funcs, worker, lambda f: ops is not None and holds(f.node, ops[1]), ("worker", "core")) if worker else []
    if ops and steps:
        steps.append(find.get((ops[0], ops[2]), Function(ops[0], ops[2], steps[-1].node)))
    out.append(hop("worker", steps, f"runs {op} ({ops[1] if ops else '?'}[{op!r}]) and answers the front"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--path", metavar="OP", help="the privileged route of OP (files/read, files/list ...)")
    opts = parser.parse_args(argv)
    mods = load(opts.repo.resolve())
    print("\n".join(route(mods, opts.path) if opts.path else report(opts.repo.resolve(), mods)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
