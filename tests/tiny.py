"""The tests' tiny random checkpoints (built by runtime/testing/random_checkpoint.py)."""

from runtime.testing.random_checkpoint import ARCHS, make_checkpoint
from runtime.testing.random_tokenizer import SPECIALS, byte_tokenizer

__all__ = ["ARCHS", "SPECIALS", "byte_tokenizer", "make_checkpoint"]
