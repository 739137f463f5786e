"""The text tower of a multimodal checkpoint, under a text model's weight names.

Multimodal releases (Gemma 3's `gemma3`, Qwen3.5's `qwen3_5`) keep the language model under a
prefix, `model.language_model.*` or `language_model.model.*` (and `language_model.lm_head.*`),
beside a vision tower and projector (`vision_tower.*`, `multi_modal_projector.*`,
`model.visual.*`, `visual.*`) that no backend here runs. Every backend keeps only the text
tower, through this one rule:

- `text_name`: the prefixed names become the text model's (`model.*`, `lm_head.*`);
- `is_vision`: the vision weights, dropped with one line on stderr (`say_vision_ignored`);
- `mtp.*` (Qwen3.5's multi-token-prediction head) is set aside unless asked for: the text model
  has no such module, and the MTP draft reads it from the checkpoint itself
  (runtime/drafts/mtp/weights.py).

Users: the torch families' `sanitize` (gemma3_text, qwen3_5), MLX Gemma 3's loader and the
stderr line of MLX Qwen3.5 (whose renaming is mlx-lm's own qwen3_5 `sanitize`). Names of a plain
text checkpoint pass unchanged. It renames; it does not fold or reshape weights (the backends'
own loaders do, e.g. mlx-lm's `sanitize`).
"""

from __future__ import annotations

import sys

PREFIXES = ("model.language_model.", "language_model.model.")  # -> "model."
VISION = ("vision_tower.", "multi_modal_projector.")  # anywhere in a name (Gemma 3)
VISION_ROOTS = ("model.visual.", "visual.")  # at the start of a name (Qwen3.5)


def is_vision(name: str) -> bool:
    """Whether `name` is a weight of the vision tower or its projector."""
    return name.startswith(VISION_ROOTS) or any(v in name for v in VISION)


def text_name(name: str) -> str:
    """A text-tower weight's name in the text model: `model.language_model.x` and
    `language_model.model.x` -> `model.x`, `language_model.lm_head.x` -> `lm_head.x`."""
    for prefix in PREFIXES:
        if name.startswith(prefix):
            return "model." + name[len(prefix) :]
    return name.removeprefix("language_model.")


def text_tower(state: dict, path=None, keep_mtp: bool = False) -> dict:
    """`state`'s text-tower weights under the text model's names; vision weights are dropped
    (with one line on stderr naming `path`, when given) and `mtp.*` set aside unless
    `keep_mtp`."""
    vision = [k for k in state if is_vision(k)]
    if vision and path is not None:
        say_vision_ignored(path, len(vision))
    out = {}
    for k, v in state.items():
        if is_vision(k) or (k.startswith("mtp.") and not keep_mtp):
            continue
        out[text_name(k)] = v
    return out


def say_vision_ignored(path, n: int | None = None) -> None:
    """One stderr line when a multimodal checkpoint carries vision weights: `n` of them, or as
    many as `path`'s safetensors files name when `n` is None (read from their headers)."""
    if n is None:
        from safetensors import safe_open

        from runtime.weights import weight_files

        n = 0
        for f in weight_files(path):
            with safe_open(str(f), framework="numpy") as st:
                n += sum(is_vision(k) for k in st.keys())
    if n:
        print(f"{path}: text tower only; ignoring {n} vision weights", file=sys.stderr)
