"""The held-out prompt set: code-completion prompts cut from held-out files only.

In the spirit of Spec-Bench, several categories exercise different kinds of
continuation. Each prompt is a prefix of a held-out file (never seen in
training), cut at a point where the natural continuation is code:

    function_body    a def with its docstring; continue with the body
    class_body       a class header with its docstring; continue with the class
    docstring        a def header and the opening quotes; continue with the docstring
    comment_to_code  a few lines and a comment; continue with the code it describes
    imports          the first import statements; continue the import block
    doctest          a docstring up to a `>>>` line; continue with the expected output
    data_literal     the start of a dict/list/tuple/set literal; continue its items

Selection is deterministic: candidates in file and line order, sampled with a
seeded `random.Random`, at most two per file per category.

    python -m apps.train.prompts [--corpus DIR] [--out apps/prompts/heldout.jsonl]
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

from runtime.errors import DuetError, cli_main

from .corpus import Corpus, load_corpus

CATEGORIES = (
    "function_body",
    "class_body",
    "docstring",
    "comment_to_code",
    "imports",
    "doctest",
    "data_literal",
)
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "prompts" / "heldout.jsonl"
MIN_CHARS, MAX_CHARS = 40, 1000
REFERENCE_CHARS = 300


def _docstring_node(node) -> ast.Expr | None:
    if node.body and isinstance(node.body[0], ast.Expr):
        v = node.body[0].value
        if isinstance(v, ast.Constant) and isinstance(v.value, str):
            return node.body[0]
    return None


def _start_line(node) -> int:
    decos = getattr(node, "decorator_list", [])
    return min([node.lineno] + [d.lineno for d in decos])


def _candidates(rel: str, text: str) -> Iterator[tuple[str, int, str, str]]:
    """(category, line, prompt, reference) for every cut point in one file."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return
    lines = text.splitlines(keepends=True)

    def upto(a: int, b: int) -> str:  # 1-based inclusive line range
        return "".join(lines[a - 1 : b])

    def rest(b: int) -> str:
        return "".join(lines[b:])[:REFERENCE_CHARS]

    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            doc = _docstring_node(node)
            start = _start_line(node)
            if doc is not None and len(node.body) >= 2:
                cat = "class_body" if isinstance(node, ast.ClassDef) else "function_body"
                yield cat, start, upto(start, doc.end_lineno), rest(doc.end_lineno)
            if doc is not None and not isinstance(node, ast.ClassDef):
                first = lines[doc.lineno - 1]
                m = re.match(r'(\s*[rRuU]?)("""|\'\'\')', first)
                if m and doc.lineno > start:
                    yield (
                        "docstring",
                        start,
                        upto(start, doc.lineno - 1) + first[: m.end()],
                        (first[m.end() :] + rest(doc.lineno)),
                    )
                # doctest: the docstring up to a `>>>` line whose next line is its output
                for i in range(doc.lineno, doc.end_lineno):
                    cur, nxt = lines[i - 1].strip(), lines[i].strip()
                    if cur.startswith(">>> ") and nxt and not nxt.startswith((">>>", "...")):
                        yield "doctest", i, upto(start, i), rest(i)
                        break
        if isinstance(node, ast.Assign) and isinstance(
            node.value, (ast.Dict, ast.List, ast.Tuple, ast.Set)
        ):
            elts = node.value.keys if isinstance(node.value, ast.Dict) else node.value.elts
            elts = [e for e in elts if e is not None]
            if (
                len(elts) >= 5
                and node.end_lineno - node.lineno >= 4
                and elts[1].end_lineno < node.end_lineno - 2
            ):
                yield (
                    "data_literal",
                    node.lineno,
                    upto(node.lineno, elts[1].end_lineno),
                    rest(elts[1].end_lineno),
                )
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    if len(imports) >= 3:
        a, b = imports[0].lineno, imports[1].end_lineno
        yield "imports", a, upto(a, b), rest(b)
    for i, line in enumerate(lines, start=1):
        s = line.strip()
        if (
            s.startswith("# ")
            and len(s.split()) >= 5
            and i < len(lines)
            and lines[i].strip()
            and not lines[i].strip().startswith("#")
        ):
            a = max(1, i - 8)
            yield "comment_to_code", i, upto(a, i), rest(i)


def build_prompts(corpus: Corpus, per_category: int = 8, seed: int = 0) -> list[dict]:
    """The prompt set for `corpus`'s held-out files, as Spec-Bench question records."""
    by_cat: dict[str, list[tuple[str, int, str, str]]] = {c: [] for c in CATEGORIES}
    for rel in corpus.heldout:
        per_file: dict[str, int] = {}
        for cat, line, prompt, ref in _candidates(rel, corpus.read(rel)):
            if not MIN_CHARS <= len(prompt) <= MAX_CHARS or not ref.strip():
                continue
            by_cat[cat].append((rel, line, prompt, ref))
            per_file[cat] = per_file.get(cat, 0) + 1
    rng = random.Random(seed)
    records = []
    for cat in CATEGORIES:
        cands = sorted(by_cat[cat], key=lambda c: (c[0], c[1]))
        rng.shuffle(cands)
        taken: dict[str, int] = {}
        for rel, line, prompt, ref in cands:
            if len([r for r in records if r["category"] == cat]) >= per_category:
                break
            if taken.get(rel, 0) >= 2:
                continue
            taken[rel] = taken.get(rel, 0) + 1
            records.append(
                {"category": cat, "turns": [prompt], "reference": [ref], "source": f"{rel}:{line}"}
            )
    return [{"question_id": i + 1, **r} for i, r in enumerate(records)]


def write_prompts(records: list[dict], out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return out


def read_prompts(path: str | Path = DEFAULT_OUT) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        raise DuetError(
            f"prompt set {str(p)!r} not found; write it with `python -m apps.train.prompts`"
        )
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m apps.train.prompts",
        description="Write the held-out prompt set (Spec-Bench question JSONL) from a corpus's "
        "held-out files.",
    )
    ap.add_argument(
        "--corpus", default=None, help="corpus directory (default: this Python's standard library)"
    )
    ap.add_argument(
        "--heldout-frac", type=float, default=0.05, help="fraction of files held out (default 0.05)"
    )
    ap.add_argument("--per-category", type=int, default=8, help="prompts per category (default 8)")
    ap.add_argument("--seed", type=int, default=0, help="selection seed (default 0)")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help=f"output JSONL (default {DEFAULT_OUT})")
    a = ap.parse_args(argv)
    corpus = load_corpus(a.corpus, heldout_frac=a.heldout_frac)
    recs = build_prompts(corpus, a.per_category, a.seed)
    out = write_prompts(recs, a.out)
    counts = {c: sum(r["category"] == c for r in recs) for c in CATEGORIES}
    print(f"wrote {len(recs)} prompts from {len(corpus.heldout)} held-out files to {out}: {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
