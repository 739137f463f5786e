"""The parser a `python -m` command starts from: its name, and its module docstring as the
description, printed as written (argparse would refill the docstring's examples and tables)."""

from __future__ import annotations

import argparse


def doc_parser(prog: str, doc: str | None, **kw) -> argparse.ArgumentParser:
    """`argparse.ArgumentParser(prog, description=doc)` that keeps `doc`'s lines; `kw` as
    argparse's (epilog, ...)."""
    return argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter, **kw
    )
