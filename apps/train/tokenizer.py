"""The shared tokenizer: byte-level BPE trained with `tokenizers` on the train files.

Byte-level means every string round-trips exactly (no unknown token, no
normalisation). `<|endoftext|>` separates files and is the models' EOS; the
chat markers are reserved so a later chat template needs no new embeddings.
Both models save the same tokenizer.json, so their vocabularies are identical.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

EOS = "<|endoftext|>"
SPECIALS = (EOS, "<|im_start|>", "<|im_end|>")
MAX_CONTEXT = 2048


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE `tokenizers.Tokenizer` with SPECIALS at ids 0, 1, 2."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes, always
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return tok


def load_tokenizer(path: str | Path):
    from tokenizers import Tokenizer

    p = Path(path)
    return Tokenizer.from_file(str(p / "tokenizer.json" if p.is_dir() else p))


def eos_id(tok, model_dir: str | Path | None = None) -> int:
    """The document separator: ours (<|endoftext|>), else the end token `model_dir`'s config
    names (a real checkpoint's: Gemma 3's <eos>)."""
    i = tok.token_to_id(EOS)
    if i is not None:
        return i
    from runtime.config import ModelConfig
    from runtime.errors import DuetError

    ids = ModelConfig.from_dir(model_dir).eos_token_ids if model_dir is not None else ()
    if not ids:
        raise DuetError(
            f"no {EOS} in the tokenizer and no eos_token_id in the config: nothing ends a document"
        )
    return ids[0]


def save_tokenizer(tok, out_dir: str | Path) -> None:
    """Write tokenizer.json and a tokenizer_config.json that transformers' AutoTokenizer reads."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": EOS,
        "pad_token": EOS,
        "bos_token": None,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_CONTEXT,
        "additional_special_tokens": list(SPECIALS[1:]),
    }
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
