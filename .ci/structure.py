"""The size and cycle rules of the package, checked in .ci/run (the layers are .importlinter's).

- no module over MAX_MODULE_LINES lines, no function over MAX_FUNCTION_LINES lines, unless
  .ci/structure-allow.txt names it with a reason;
- no import cycle between modules, counting imports inside functions and under TYPE_CHECKING.

Run: python .ci/structure.py [SRC_DIR]   (exit 1 and one line per breach when a rule is broken)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60
ALLOW = Path(__file__).with_name("structure-allow.txt")


def allowed() -> set[str]:
    """Entries of the allow-list: ``path`` or ``path:function``, each followed by `` - reason``."""
    names = set()
    for line in ALLOW.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, sep, reason = line.partition(" - ")
            if not sep or not reason.strip():
                sys.exit(f"{ALLOW.name}: an entry needs ' - <reason>': {line!r}")
            names.add(name.strip())
    return names


def size_breaches(src: Path, allow: set[str]) -> list[str]:
    out = []
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).as_posix()
        text = path.read_text()
        if (n := text.count("\n")) > MAX_MODULE_LINES and rel not in allow:
            out.append(f"{rel}: {n} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = (node.end_lineno or node.lineno) - node.lineno + 1
                if n > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in allow:
                    out.append(f"{rel}:{node.lineno} {node.name}: {n} lines")
    return out


def cycles(package: str) -> list[list[str]]:
    """The import cycles of ``package`` (strongly connected components of two or more)."""
    graph = grimp.build_graph(package)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(start: str) -> None:  # Tarjan's algorithm, iterative (no recursion limit)
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    work.append((target, iter(sorted(edges[target]))))
                    break
                if target in stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def main() -> int:
    src = Path(sys.argv[1] if len(sys.argv) > 1 else "src/agentkernel")
    breaches = size_breaches(src, allowed())
    breaches += [f"import cycle: {' <-> '.join(c)}" for c in cycles(src.name)]
    for line in breaches:
        print(line)
    print(f"structure: {len(breaches)} breach(es)")
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main())
