"""The byte-level tokenizer every tiny random checkpoint carries (random_checkpoint.py,
random_hybrid.py, random_gemma.py): 256 bytes and the chat specials, no merges, padded to
any vocabulary size.
"""

from __future__ import annotations

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def byte_tokenizer(vocab_size: int):
    """A byte-level BPE tokenizer with no merges: 256 bytes + specials, padded to vocab_size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for s in SPECIALS:
        vocab[s] = len(vocab)
    while len(vocab) < vocab_size:
        vocab[f"<|unused{len(vocab)}|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    return tok
