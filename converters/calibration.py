"""Real token sequences for calibrating quantizers: short texts of several kinds
(prose, code, dialogue, numbers), tokenized with the checkpoint's own tokenizer.

Kept apart from the held-out prompts that parity checks use, so a quantizer is
never scored on what it was calibrated on.
"""

from __future__ import annotations

from pathlib import Path

TEXTS = (
    "Once upon a time, in a small village by the sea, there lived an old fisherman.",
    "import numpy as np\n\ndef softmax(x):\n    e = np.exp(x - x.max())\n    return e / e.sum()",
    "User: What is the tallest mountain in the world?\nAssistant: Mount Everest, at 8,849 metres.",
    "1, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 377, 610, 987",
    "The mitochondria is the powerhouse of the cell; it produces ATP through respiration.",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>",
)


def calibration_tokens(model_dir: str | Path, max_len: int = 32) -> list[list[int]]:
    """TEXTS tokenized with `model_dir/tokenizer.json`, each cut to `max_len` tokens."""
    from tokenizers import Tokenizer

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        from runtime.errors import DuetError

        raise DuetError(f"{model_dir}: no tokenizer.json to tokenize the calibration texts with")
    tok = Tokenizer.from_file(str(path))
    return [tok.encode(t).ids[:max_len] for t in TEXTS]
