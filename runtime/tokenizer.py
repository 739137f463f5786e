"""Text <-> token ids for a checkpoint, and the pair check the runtime needs.

Plain `tokenizers` for encode/decode (fast, no transformers import); the chat
template, when a checkpoint has one, comes from transformers' AutoTokenizer
and is only loaded by the chat.
"""

from __future__ import annotations

import json
from pathlib import Path

from runtime.errors import DuetError


class Tokenizer:
    """Encode/decode with a checkpoint's tokenizer.json, plus streaming detokenization."""

    def __init__(self, path):
        from tokenizers import Tokenizer as HFTokenizer

        p = Path(path)
        f = p / "tokenizer.json" if p.is_dir() else p
        if not f.is_file():
            raise DuetError(f"{p}: no tokenizer.json; pass --prompt-ids to run without a tokenizer")
        try:
            self.tok = HFTokenizer.from_file(str(f))
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise DuetError(f"{f}: not a valid tokenizer ({str(e).splitlines()[0]})") from None
        self.path = f

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False)

    def vocab(self) -> dict[str, int]:
        return self.tok.get_vocab(with_added_tokens=True)

    def token_id(self, text: str) -> int | None:
        return self.tok.token_to_id(text)


class Detokenizer:
    """Streams text as tokens arrive, holding back an incomplete UTF-8 sequence."""

    def __init__(self, tokenizer: Tokenizer):
        self.tk = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def add(self, ids: list[int]) -> str:
        self.ids += ids
        text = self.tk.decode(self.ids)
        if text.endswith("\ufffd"):  # a multi-byte character is not complete yet
            return ""
        new, self.emitted = text[len(self.emitted) :], text
        return new


def check_pair(target_dir, draft_dir, target_cfg, draft_cfg) -> None:
    """Refuse a draft whose vocabulary differs from the target's (one clear line)."""
    if target_cfg.vocab_size != draft_cfg.vocab_size:
        raise DuetError(
            f"draft vocabulary size {draft_cfg.vocab_size} differs from the target's "
            f"{target_cfg.vocab_size}; a draft must share the target's tokenizer"
        )
    tv, dv = _vocab_file(target_dir), _vocab_file(draft_dir)
    if tv is not None and dv is not None and tv != dv:
        raise DuetError(
            "draft and target tokenizers differ (tokenizer.json vocabularies are not equal); "
            "pick a draft from the target's family"
        )


def _vocab_file(d) -> dict | None:
    if d is None:
        return None
    p = Path(d)
    f = p / "tokenizer.json" if p.is_dir() else p.parent / "tokenizer.json"
    if not f.is_file():
        return None
    try:
        model = json.loads(f.read_text()).get("model", {})
    except json.JSONDecodeError:
        raise DuetError(f"{f}: not valid JSON") from None
    return model.get("vocab")
