"""Size and form discipline, measured from the code (issue 55, item 7).

- no source file over 400 lines, no function over 100 lines: a file or function past the
  line is split by responsibility or stage; the few named below are exceptions, each with why;
- `# fmt: skip` only on tables (an assignment of a literal dict, list, tuple or set laid out by
  hand), never to keep a long call on one line;
- lines within 100 columns (pyproject's ruff line length) in the packages and the tests.
Each check also runs on a small synthetic tree that breaks it, so none can pass by checking
nothing.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernels", "runtime", "converters", "devices", "apps")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 100
MAX_COLUMNS = 100
# "path" -> why it may pass the file limit. Each was under 400 lines while `# fmt: skip` held
# its calls on one line; ruff's layout took it past (issue 55). They are split next: the test
# below fails once one is under the limit, so the list only shrinks.
LAID_OUT = "over 400 once ruff laid out the calls `# fmt: skip` had kept on one line; split next"
LONG_FILES: dict[str, str] = {
    "runtime/backends/onnx/target.py": LAID_OUT,
}
# "path:function" -> why it may pass the function limit
LONG_FUNCTIONS: dict[str, str] = {
}
MARK = re.compile(r"#\s*fmt:\s*skip\s*$")


def source_files(root: Path, with_tests: bool = False) -> dict[str, Path]:
    """'pkg/mod.py' -> path, for every .py file under the packages (and tests/)."""
    out = {}
    for pkg in PACKAGES + (("tests",) if with_tests else ()):
        for f in sorted((root / pkg).rglob("*.py")):
            out[f.relative_to(root).as_posix()] = f
    return out


def long_files(root: Path) -> list[str]:
    return sorted(
        f"{rel} ({n} lines)"
        for rel, f in source_files(root).items()
        if (n := len(f.read_text().splitlines())) > MAX_FILE_LINES and rel not in LONG_FILES
    )


def long_functions(root: Path) -> list[str]:
    out = []
    for rel, f in source_files(root).items():
        for node in ast.walk(ast.parse(f.read_text(), filename=rel)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in LONG_FUNCTIONS:
                    out.append(f"{rel}:{node.lineno} {node.name} ({n} lines)")
    return sorted(out)


def is_table(node: ast.stmt) -> bool:
    """An assignment of a literal dict, list, tuple or set: data laid out in rows."""
    value = getattr(node, "value", None)
    return isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(
        value, ast.Dict | ast.List | ast.Tuple | ast.Set
    )


def skips_off_tables(root: Path) -> list[str]:
    """`# fmt: skip` markers on a statement that is not a table."""
    out = []
    for rel, f in source_files(root, with_tests=True).items():
        src = f.read_text()
        marked = {i for i, line in enumerate(src.splitlines(), 1) if MARK.search(line)}
        if not marked:
            continue
        tables = {
            n.end_lineno
            for n in ast.walk(ast.parse(src, filename=rel))
            if isinstance(n, ast.stmt) and n.end_lineno in marked and is_table(n)
        }
        out += [f"{rel}:{i}" for i in sorted(marked - tables)]
    return out


def wide_lines(root: Path) -> list[str]:
    return [
        f"{rel}:{i} ({len(line)} columns)"
        for rel, f in source_files(root, with_tests=True).items()
        for i, line in enumerate(f.read_text().splitlines(), 1)
        if len(line) > MAX_COLUMNS
    ]


# ---- the tree ----------------------------------------------------------------------------


def test_no_source_file_over_400_lines():
    assert long_files(ROOT) == []


def test_no_function_over_100_lines():
    assert long_functions(ROOT) == []


def test_fmt_skip_only_on_tables():
    assert skips_off_tables(ROOT) == []


def test_lines_within_100_columns():
    assert wide_lines(ROOT) == []


def test_the_named_exceptions_are_still_needed():
    """An exception whose file or function has come under the limit is struck from the list."""
    for rel in LONG_FILES:
        assert len((ROOT / rel).read_text().splitlines()) > MAX_FILE_LINES, rel
    for key in LONG_FUNCTIONS:
        rel, name = key.split(":")
        sizes = [
            n.end_lineno - n.lineno + 1
            for n in ast.walk(ast.parse((ROOT / rel).read_text()))
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
        ]
        assert sizes and max(sizes) > MAX_FUNCTION_LINES, key


# ---- the checks themselves, on a synthetic tree that breaks each rule ---------------------


def test_the_checks_catch_a_long_file_a_long_function_a_stray_skip_and_a_wide_line(tmp_path):
    for pkg in (*PACKAGES, "tests"):
        (tmp_path / pkg).mkdir()
    ok = tmp_path / "runtime" / "ok.py"
    ok.write_text("TABLE = {\n    1: 2,\n}  # fmt: skip\n\n\ndef f():\n    return 1\n")
    assert long_files(tmp_path) == long_functions(tmp_path) == []
    assert skips_off_tables(tmp_path) == wide_lines(tmp_path) == []

    (tmp_path / "runtime" / "big.py").write_text("X = 1\n" * 401)
    assert long_files(tmp_path) == ["runtime/big.py (401 lines)"]
    body = "".join(f"    x{i} = {i}\n" for i in range(100))
    (tmp_path / "apps" / "fn.py").write_text(f"def g():\n{body}")
    assert long_functions(tmp_path) == ["apps/fn.py:1 g (101 lines)"]
    (tmp_path / "tests" / "t.py").write_text("y = max(1,\n        2)  # fmt: skip\n")
    assert skips_off_tables(tmp_path) == ["tests/t.py:2"]
    (tmp_path / "kernels" / "w.py").write_text("z = '" + "a" * 100 + "'\n")
    assert wide_lines(tmp_path) == ["kernels/w.py:1 (106 columns)"]
