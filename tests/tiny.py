"""The tests' tiny random checkpoints (built by runtime/random_checkpoint.py)."""

from runtime.random_checkpoint import ARCHS, make_checkpoint
from runtime.random_tokenizer import SPECIALS, byte_tokenizer

__all__ = ["ARCHS", "SPECIALS", "byte_tokenizer", "make_checkpoint"]
