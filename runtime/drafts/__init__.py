"""Drafts that load no model: `--draft lookup` (prompt lookup) and `--draft suffix`
(SuffixDecoding). Each is a `ModelFreeDraft` (runtime/drafts/base.py) that `sd` drafts chains
with and `tree` drafts trees with; `--draft suffix:FILE` adds a corpus file's text.

The drafts that run a model fitted to the target live in sub-packages, one per kind, with a
file per backend: head/ (`--draft head`, EAGLE-3), mtp/ (`--draft mtp`, the target's `mtp.*`
head) and ss/ (speculative-streaming drafts).
"""

from __future__ import annotations

from runtime.drafts.base import ModelFreeDraft, is_model_free

MODEL_FREE = ("lookup", "suffix")

__all__ = ["MODEL_FREE", "ModelFreeDraft", "is_model_free", "is_model_free_spec", "load_model_free"]


def is_model_free_spec(spec: str | None) -> bool:
    """Whether a --draft value names a model-free draft (`lookup`, `suffix`, `suffix:FILE`)."""
    return spec is not None and (spec in MODEL_FREE or str(spec).startswith("suffix:"))


def load_model_free(spec: str, target, tokenizer=None) -> ModelFreeDraft:
    """The model-free draft `spec` names, over `target`'s vocabulary. `suffix:FILE` feeds the
    file's text (tokenized with `tokenizer`; one document per blank-line-separated block) to
    the suffix draft's corpus trie."""
    from runtime.errors import DuetError

    if spec == "lookup":
        from runtime.drafts.lookup import LookupDraft

        return LookupDraft(target.config)
    from runtime.drafts.suffix import SuffixDraft

    draft = SuffixDraft(target.config)
    if spec.startswith("suffix:"):
        from pathlib import Path

        path = Path(spec[len("suffix:") :]).expanduser()
        if not path.is_file():
            raise DuetError(f"--draft {spec}: no such corpus file {path}")
        if tokenizer is None:
            raise DuetError(f"--draft {spec}: the target has no tokenizer.json to read it with")
        text = path.read_text(encoding="utf-8", errors="replace")
        docs = [d for d in text.split("\n\n") if d.strip()]
        draft.add_corpus([tokenizer.encode(d) for d in docs])
    return draft
