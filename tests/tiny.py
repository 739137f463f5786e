"""The tests' tiny random checkpoints (built by runtime/random_checkpoint.py)."""

from runtime.random_checkpoint import ARCHS, SPECIALS, byte_tokenizer, make_checkpoint

__all__ = ["ARCHS", "SPECIALS", "byte_tokenizer", "make_checkpoint"]
