"""The benchmark's prompt set: Spec-Bench question records, and each turn's prompt ids.

Records are JSON lines `{"question_id", "category", "turns": [...]}` (the
held-out set the training program writes to apps/prompts/). A turn's prompt is
the conversation so far: the checkpoint's chat template when it has one,
otherwise plain completion (each turn followed by its answer, then a newline).
"""

from __future__ import annotations

import json
from pathlib import Path

from runtime.errors import DuetError

DEFAULT_DIR = Path(__file__).resolve().parents[1] / "prompts"
# named sets (`--prompts chat`): chat.jsonl covers Spec-Bench's six categories (multi-turn,
# translation, summarization, QA, math reasoning, RAG) for chat models, written here; its
# summarization and RAG prompts carry passages, which input-grounded drafts can copy from
NAMED = {"chat": DEFAULT_DIR / "chat"}


def load_prompts(
    path: str | Path | None = None,
    *,
    limit: int | None = None,
    categories: list[str] | None = None,
    per_category: int | None = None,
) -> list[dict]:
    """Question records from a .jsonl file or a folder of them (default apps/prompts/), or a
    named set (NAMED: `chat`); `per_category`: the first N of each category, then `limit`."""
    p = Path(path) if path is not None else DEFAULT_DIR
    if str(path) in NAMED and not p.exists():
        p = NAMED[str(path)]
    files = sorted(p.glob("*.jsonl")) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise DuetError(
            f"prompt set {str(p)!r} not found (expected a .jsonl file or a folder of them); "
            "write it with `python -m apps.train.prompts` or pass --prompts FILE.jsonl"
        )
    recs = []
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                raise DuetError(f"{f}:{n}: not a JSON object") from None
            if not isinstance(r.get("turns"), list) or not r["turns"]:
                raise DuetError(f"{f}:{n}: a record needs a non-empty list 'turns'")
            r.setdefault("question_id", len(recs) + 1)
            r.setdefault("category", "uncategorized")
            recs.append(r)
    if categories:
        known = sorted({r["category"] for r in recs})
        bad = [c for c in categories if c not in known]
        if bad:
            raise DuetError(
                f"--categories: unknown {', '.join(bad)}; the set has {', '.join(known)}"
            )
        recs = [r for r in recs if r["category"] in categories]
    if per_category is not None:
        if per_category < 1:
            raise DuetError(f"--per-category-limit must be at least 1 (got {per_category})")
        seen: dict[str, int] = {}
        kept = []
        for r in recs:
            seen[r["category"]] = seen.get(r["category"], 0) + 1
            if seen[r["category"]] <= per_category:
                kept.append(r)
        recs = kept
    if limit is not None:
        recs = recs[:limit]
    if not recs:
        raise DuetError(f"no prompts selected from {p}")
    return recs


def add_sample_args(ap) -> None:
    """`--prompts` and `--per-category`: the sample a study reads with `sample_prompts`."""
    ap.add_argument("--prompts", default="chat", help="a named set or a .jsonl (default chat)")
    ap.add_argument("--per-category", type=int, default=2, help="prompts per category (2)")


def sample_prompts(a) -> list[dict]:
    """The records `add_sample_args`' flags name: the first `--per-category` of each."""
    return load_prompts(a.prompts, per_category=a.per_category)


def turn_ids(tokenizer, template, turns: list[str], answers: list[str]) -> list[int]:
    """Prompt ids for turn len(answers): the earlier turns with their answers, then this one."""
    if template is not None:
        msgs = []
        for q, a in zip(turns, answers, strict=False):
            msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        msgs.append({"role": "user", "content": turns[len(answers)]})
        return template.render(msgs)
    # an answer continues its turn; the next turn starts on a new line
    return tokenizer.encode(
        "".join(q + a + "\n" for q, a in zip(turns, answers, strict=False)) + turns[len(answers)]
    )
