"""Per-prompt records in Spec-Bench's answer format, one JSONL file per method and temperature.

Each line: question_id, category, answer_id, model_id, tstamp and
choices=[{index, turns, decoding_steps, new_tokens, wall_time, accept_lengths}]
(per-turn lists, accept_lengths flat across turns as Spec-Bench's speed.py
reads it), plus `matches_ar` at temperature 0.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path


def answer_record(r: dict, model_id: str) -> dict:
    return {
        "question_id": r["question_id"],
        "category": r["category"],
        "answer_id": uuid.uuid4().hex,
        "model_id": f"{model_id}-{r['method']}",
        "choices": [
            {
                "index": 0,
                "turns": r["turns"],
                "decoding_steps": r["decoding_steps"],
                "new_tokens": r["new_tokens"],
                "wall_time": r["wall_time"],
                "accept_lengths": r["accept_lengths"],
            }
        ],
        "tstamp": time.time(),
        "temperature": r["temp"],
        "matches_ar": r["matches_ar"],
    }


def write_answers(out_dir, records: list[dict], model_id: str) -> list[Path]:
    """Write `{model_id}-{method}-temperature-{t}.jsonl` files; returns their paths."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    files: dict[Path, list[str]] = {}
    for r in records:
        if r.get("round", 0):  # --rounds repeats the same texts: one answer each
            continue
        f = d / f"{model_id}-{r['method']}-temperature-{r['temp']:g}.jsonl"
        files.setdefault(f, []).append(json.dumps(answer_record(r, model_id)))
    for f, lines in files.items():
        f.write_text("\n".join(lines) + "\n")
    return sorted(files)
