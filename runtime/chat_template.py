"""A checkpoint's chat template: messages -> the token ids of the prompt to continue.

transformers' AutoTokenizer renders it (the Jinja template the checkpoint ships), loaded only
when the checkpoint has one: `ChatTemplate.load(dir)` is None otherwise.
"""

from __future__ import annotations

import json
from pathlib import Path

from runtime.errors import DuetError


class ChatTemplate:
    """The checkpoint's chat template (transformers' AutoTokenizer), loaded only when present."""

    def __init__(self, hf_tokenizer):
        self.hf = hf_tokenizer

    @classmethod
    def load(cls, model_dir) -> ChatTemplate | None:
        """The template of `model_dir`, or None when tokenizer_config.json has none."""
        d = Path(model_dir)
        cfg = d / "tokenizer_config.json"
        has = (d / "chat_template.jinja").is_file() or (d / "chat_template.json").is_file()
        if not has and cfg.is_file():
            try:
                has = bool(json.loads(cfg.read_text()).get("chat_template"))
            except json.JSONDecodeError:
                raise DuetError(f"{cfg}: not valid JSON") from None
        if not has:
            return None
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(str(d)))

    def render(self, messages: list[dict]) -> list[int]:
        """Token ids of `messages` followed by the assistant's generation prompt."""
        out = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(out, dict) or hasattr(out, "keys"):  # BatchEncoding in newer transformers
            out = out["input_ids"]
        return [int(t) for t in out]

    def render_text(self, messages: list[dict]) -> str:
        """The text `render` tokenizes."""
        return self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)

    def encode(self, text: str) -> list[int]:
        """Ids of a piece of rendered text, as `render` tokenizes it (no specials added)."""
        return [int(t) for t in self.hf.encode(text, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        """The text of `ids`, special tokens and spaces as they are (the inverse `splice` checks
        against: runtime/chat_splice.py)."""
        return self.hf.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
