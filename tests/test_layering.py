"""Dependencies point down (docs/design.md, Layering), measured from the code's imports.

Every `import` and `from ... import` in the tree is parsed, lazy ones inside functions
included, and resolved to the file it loads. Two rules:
- the engine (kernels/, and runtime/ but for its command modules) imports nothing from
  devices/, converters/ or apps/;
- no circle of imports between files.
(Sizes are tests/test_discipline.py's.) Each rule is also run on a small synthetic tree that
breaks it, so the checks cannot pass by checking nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "runtime", "converters", "devices", "apps")
UPPER = ("devices", "converters", "apps")
# runtime's command layer: the CLIs, the Python API beside them and the flag helpers, which
# build what the engine needs from higher layers (the latency model, emulation) and pass it in
COMMANDS = {"runtime/generate.py", "runtime/chat.py", "runtime/api.py"}


def source_files(root: Path) -> dict[str, Path]:
    """'pkg/mod.py' -> path, for every .py file under the packages."""
    out = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            out[f.relative_to(root).as_posix()] = f
    return out


def module_file(name: str, files: dict[str, Path]) -> str | None:
    """The file `import name` loads: pkg/a/b.py or pkg/a/b/__init__.py, else None."""
    base = name.replace(".", "/")
    for cand in (f"{base}.py", f"{base}/__init__.py"):
        if cand in files:
            return cand
    return None


def type_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: annotations only, never run."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            out |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return out


def imports_of(rel: str, source: str, files: dict[str, Path]) -> set[str]:
    """The files `rel` imports (anywhere in it: at the top or inside a function), resolved
    within the tree; those under `if TYPE_CHECKING:` are annotations, never run, and left out."""
    pkg = rel.split("/")[:-1]  # the package the file lives in
    out: set[str] = set()
    tree = ast.parse(source, filename=rel)
    skip = type_only(tree)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the file's package, up level - 1
                up = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            # `from a.b import c`: the module a/b/c.py when it exists, else a/b itself
            full = [f"{base}.{a.name}" if base else a.name for a in node.names]
            names = [f if module_file(f, files) else base for f in full]
        else:
            continue
        for name in names:
            f = module_file(name, files)
            if f is not None and f != rel:
                out.add(f)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    files = source_files(root)
    return {rel: imports_of(rel, f.read_text(), files) for rel, f in files.items()}


def is_engine(rel: str) -> bool:
    if rel.startswith("kernels/"):
        return True
    if not rel.startswith("runtime/"):
        return False
    return rel not in COMMANDS and not Path(rel).name.startswith("cli_args")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{a} -> {b}"
        for a, deps in graph.items()
        if is_engine(a)
        for b in deps
        if b.split("/")[0] in UPPER
    )


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one file (Tarjan's algorithm, iterative)."""
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
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                group = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    group.append(w)
                    if w == v:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


# ---- the tree ----------------------------------------------------------------------------


def test_the_engine_imports_nothing_from_above():
    assert upward_imports(import_graph(ROOT)) == [], (
        "the engine imports from above (docs/design.md)"
    )


def test_no_circle_of_imports_between_files():
    assert circles(import_graph(ROOT)) == [], "files that import each other in a circle"


# ---- the checks themselves, on a synthetic tree that breaks each rule ---------------------


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def test_the_checks_catch_an_upward_import_and_a_circle(tmp_path):
    for pkg in PACKAGES:
        write(tmp_path, f"{pkg}/__init__.py", "")
    write(tmp_path, "devices/probe.py", "X = 1\n")
    write(tmp_path, "kernels/fine.py", "import numpy\n")
    write(tmp_path, "runtime/ok.py", "from kernels import fine\n")
    write(tmp_path, "runtime/generate.py", "from devices.probe import X\n")  # a command: allowed
    write(tmp_path, "runtime/cli_args.py", "import devices.probe\n")  # a flag helper: allowed
    g = import_graph(tmp_path)
    assert upward_imports(g) == [] and circles(g) == []
    assert g["runtime/ok.py"] == {"kernels/fine.py"}

    # an upward import hidden in a function (lazy) is still one
    write(
        tmp_path, "runtime/engine.py", "def f():\n    from devices.probe import X\n    return X\n"
    )
    assert upward_imports(import_graph(tmp_path)) == ["runtime/engine.py -> devices/probe.py"]
    write(tmp_path, "runtime/engine.py", "def f():\n    from .. import devices\n")  # relative
    assert upward_imports(import_graph(tmp_path)) == ["runtime/engine.py -> devices/__init__.py"]
    # an annotation-only import (never run) is not one
    write(
        tmp_path,
        "runtime/engine.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from devices.probe import X\n",
    )
    assert upward_imports(import_graph(tmp_path)) == []
    write(tmp_path, "runtime/engine.py", "")

    # a circle of three files, one edge lazy and one relative
    write(tmp_path, "runtime/a.py", "from runtime import b\n")
    write(tmp_path, "runtime/b.py", "def g():\n    import runtime.c\n")
    write(tmp_path, "runtime/c.py", "from .a import *\n")
    assert circles(import_graph(tmp_path)) == [["runtime/a.py", "runtime/b.py", "runtime/c.py"]]
    write(tmp_path, "runtime/c.py", "")
    assert circles(import_graph(tmp_path)) == []
