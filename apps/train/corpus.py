"""The training corpus: which files, the held-out split, token streams, batches.

The default corpus is the Python standard library's own source, which every
machine with Python has. Test suites (`test/`, `tests/`, `idle_test/`) and
`site-packages/` are left out: the tests are half the stdlib by size, repetitive,
and not the code a user asks the model to write.

Files are split into train and held-out *whole*, by a hash of their relative
path, so the split does not depend on the training seed, on the order the
filesystem lists files, or on which other files exist.
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

import numpy as np

from runtime.errors import DuetError

DEFAULT_INCLUDE = ("*.py",)
DEFAULT_EXCLUDE_DIRS = ("test", "tests", "idle_test", "site-packages", "__pycache__")
SPLIT_SALT = "duet-heldout-v1"  # changing this changes the split: bump only on purpose


def stdlib_dir() -> Path:
    """The directory of this interpreter's standard library source."""
    return Path(sysconfig.get_paths()["stdlib"])


@dataclass(frozen=True)
class Corpus:
    """The corpus files, split. Paths are relative to `root`, posix, sorted."""

    root: Path
    train: tuple[str, ...]
    heldout: tuple[str, ...]

    def read(self, rel: str) -> str:
        return read_text(self.root / rel)

    def texts(self, which: str, max_chars: int | None = None) -> Iterator[str]:
        """The texts of split `which` in order; with `max_chars`, stop after the text that
        brings the total to at least that many characters."""
        n = 0
        for rel in getattr(self, which):
            text = self.read(rel)
            yield text
            n += len(text)
            if max_chars is not None and n >= max_chars:
                return


def read_text(path: Path) -> str:
    # Invalid bytes become U+FFFD rather than dropping the file: byte-level BPE copes.
    return path.read_bytes().decode("utf-8", errors="replace")


def list_files(
    root: Path,
    include: tuple[str, ...] = DEFAULT_INCLUDE,
    exclude_dirs: tuple[str, ...] = DEFAULT_EXCLUDE_DIRS,
) -> list[str]:
    """Relative posix paths of the files under `root` matching `include`, sorted."""
    if not root.is_dir():
        raise DuetError(f"corpus directory {str(root)!r} does not exist or is not a directory")
    out = []
    for p in root.rglob("*"):
        rel = p.relative_to(root)
        if any(part in exclude_dirs for part in rel.parts[:-1]):
            continue
        if p.is_file() and any(fnmatch(p.name, pat) for pat in include):
            out.append(rel.as_posix())
    return sorted(out)


def heldout_score(rel: str) -> float:
    """A fixed pseudo-random number in [0, 1) for a relative path."""
    h = hashlib.sha256(f"{SPLIT_SALT}:{rel}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2**64


def split_files(files: list[str], heldout_frac: float) -> tuple[list[str], list[str]]:
    """Split whole files by `heldout_score`; at least one file on each side."""
    if len(files) < 2:
        raise DuetError(
            f"the corpus needs at least 2 files (one to train on, one held out); found {len(files)}"
        )
    scored = sorted(files, key=heldout_score)
    n_held = sum(heldout_score(f) < heldout_frac for f in files)
    n_held = min(max(n_held, 1), len(files) - 1)
    held = set(scored[:n_held])
    return sorted(f for f in files if f not in held), sorted(held)


def load_corpus(
    root: str | Path | None = None,
    *,
    include: tuple[str, ...] = DEFAULT_INCLUDE,
    exclude_dirs: tuple[str, ...] = DEFAULT_EXCLUDE_DIRS,
    heldout_frac: float = 0.05,
) -> Corpus:
    """Find the corpus files under `root` (default: the stdlib) and split them."""
    if not 0.0 < heldout_frac < 1.0:
        raise DuetError(f"--heldout-frac must be in (0, 1); got {heldout_frac}")
    root = Path(root) if root is not None else stdlib_dir()
    files = list_files(root, include, exclude_dirs)
    if not files:
        raise DuetError(
            f"corpus directory {str(root)!r} has no files matching {' '.join(include)} "
            f"(outside {', '.join(exclude_dirs)}); point --corpus at a directory of code "
            f"or pass --include"
        )
    train, held = split_files(files, heldout_frac)
    return Corpus(root=root, train=tuple(train), heldout=tuple(held))


def corpus_from_split(split_path: str | Path, root: str | Path | None = None) -> tuple[Corpus, int]:
    """The corpus and sequence length of a trained pair, from the split.json apps.train wrote
    beside it; `root` overrides the recorded corpus root. The held-out files follow from the
    rule and the fraction recorded there (the list in the file is a record, not an input)."""
    try:
        split = json.loads(Path(split_path).read_text())
        rec_root, frac = split["corpus_root"], float(split["heldout_frac"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DuetError(f"{split_path}: not a split.json written by apps.train ({e})") from None
    corpus = load_corpus(
        root or rec_root,
        include=tuple(split.get("include", DEFAULT_INCLUDE)),
        exclude_dirs=tuple(split.get("exclude_dirs", DEFAULT_EXCLUDE_DIRS)),
        heldout_frac=frac,
    )
    return corpus, int(split.get("seq_len", 512))


def token_stream(texts: Iterator[str], encode_batch, eos_id: int) -> np.ndarray:
    """All texts tokenized and concatenated, each followed by `eos_id`. (N,) int32."""
    texts = list(texts)
    pieces = []
    for ids in encode_batch(texts):
        pieces.append(np.asarray(ids, dtype=np.int32))
        pieces.append(np.asarray([eos_id], dtype=np.int32))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)


class BatchSampler:
    """Random contiguous windows of a token stream, from a seeded generator.

    Each batch is (x, y) with y = x shifted by one: (B, T) int64 each.
    """

    def __init__(self, stream: np.ndarray, batch_size: int, seq_len: int, seed: int):
        if len(stream) < seq_len + 2:
            raise DuetError(
                f"the training text is {len(stream)} tokens, shorter than --seq-len {seq_len} + 2; "
                f"use a larger corpus or a smaller --seq-len"
            )
        self.stream, self.B, self.T = stream, batch_size, seq_len
        self.rng = np.random.default_rng(seed)

    def __next__(self):
        import torch

        starts = self.rng.integers(0, len(self.stream) - self.T - 1, size=self.B)
        win = np.stack([self.stream[s : s + self.T + 1] for s in starts]).astype(np.int64)
        w = torch.from_numpy(win)
        return w[:, :-1], w[:, 1:]

    def __iter__(self):
        return self


def eval_windows(stream: np.ndarray, seq_len: int, max_tokens: int) -> list[np.ndarray]:
    """Non-overlapping windows of seq_len+1 tokens from the start, up to max_tokens targets."""
    out, s = [], 0
    while s + 2 <= len(stream) and len(out) * seq_len < max_tokens:
        out.append(stream[s : s + seq_len + 1].astype(np.int64))
        s += seq_len
    return out
