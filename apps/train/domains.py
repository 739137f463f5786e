"""The domains an evolving target is fine-tuned on: text every fresh machine has, no download.

Each domain differs clearly from the embedded pair's training text (the standard library's
own source outside its test suites, see corpus.py):

- `stdlib-tests`: the standard library's test suite, `Lib/test/**/*.py` (820 files on
  CPython 3.11 builds such as pyenv's and the python.org/Docker images; Debian's system
  Python ships it as `libpython3.11-testsuite`). Code, but test code: asserts, fixtures,
  literal data. The base never saw it (corpus.py excludes `test/`).
- `docstrings`: the docstrings and `#` comments alone of the standard library's non-test
  `.py` files, one document per source file (English prose about code, no code).
- `licenses`: `/usr/share/common-licenses/*` (Debian/Ubuntu `base-files`, on every such
  machine and container): legal English prose, nothing like Python.

Every domain is split into train and held-out by corpus.py's path hash, whole documents,
so the split is fixed whatever the machine lists first. This module does not tokenize.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass
from pathlib import Path

from runtime.errors import DuetError

from .corpus import DEFAULT_EXCLUDE_DIRS, list_files, read_text, split_files, stdlib_dir

HELDOUT_FRAC = 0.1
LICENSES_DIR = Path("/usr/share/common-licenses")


@dataclass(frozen=True)
class Domain:
    """A named corpus split into train and held-out documents (relative paths under root)."""

    name: str
    root: Path
    train: tuple[str, ...]
    heldout: tuple[str, ...]
    extract: str = "text"  # "text": the file as is; "prose": its docstrings and comments

    def read(self, rel: str) -> str:
        text = read_text(self.root / rel)
        return prose_of(text) if self.extract == "prose" else text

    def texts(self, which: str) -> list[str]:
        return [t for t in (self.read(r) for r in getattr(self, which)) if t.strip()]


def prose_of(source: str) -> str:
    """The docstrings and comments of a Python source, in order, one block per paragraph."""
    out: list[str] = []
    try:
        tree = ast.parse(source)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    out.append(doc)
    except (SyntaxError, ValueError):
        pass
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT and not tok.string.startswith("#!"):
                out.append(tok.string.lstrip("#").strip())
    except (tokenize.TokenError, SyntaxError, ValueError):
        pass
    return "\n\n".join(out)


DOMAINS = ("stdlib-tests", "docstrings", "licenses")


def load_domain(name: str, heldout_frac: float = HELDOUT_FRAC) -> Domain:
    """Find and split the named domain's documents; DuetError if absent on this machine."""
    if name == "stdlib-tests":
        root = stdlib_dir() / "test"
        if not root.is_dir():
            raise DuetError(
                f"domain stdlib-tests: {root} is missing (Debian: apt install "
                f"libpython3-testsuite); choose another --domain from {', '.join(DOMAINS)}"
            )
        files, extract = list_files(root, ("*.py",), ("__pycache__",)), "text"
    elif name == "docstrings":
        root = stdlib_dir()
        files, extract = list_files(root, ("*.py",), DEFAULT_EXCLUDE_DIRS), "prose"
    elif name == "licenses":
        root = LICENSES_DIR
        if not root.is_dir():
            raise DuetError(f"domain licenses: {root} is missing (not a Debian/Ubuntu machine)")
        files, extract = list_files(root, ("*",), ()), "text"
    else:
        raise DuetError(f"--domain {name!r}: unknown; choose from {', '.join(DOMAINS)}")
    train, held = split_files(files, heldout_frac)
    return Domain(name, root, tuple(train), tuple(held), extract)
