"""What a decoding step reports, and the sampling settings every strategy takes."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from kernels.gumbel_field import DENSE_UP_TO, GumbelField, fold
from kernels.sampling import log_probs_from_logits, probs_from_logits, sample


@dataclass(frozen=True)
class Sampling:
    """How tokens are drawn. temp == 0 is greedy. The same settings shape p and q."""

    temp: float = 0.0
    top_p: float = 1.0
    top_k: int = 0

    @property
    def greedy(self) -> bool:
        return self.temp == 0

    def probs(self, logits: np.ndarray) -> np.ndarray:
        return probs_from_logits(logits, self.temp, self.top_p, self.top_k)

    def log_probs(self, logits: np.ndarray) -> np.ndarray:
        """log self.probs(logits), -inf where filtered (temp > 0 only)."""
        return log_probs_from_logits(logits, self.temp, self.top_p, self.top_k)

    def lazy(self, vocab: int) -> bool:
        """Draw by Gumbel-max over logits / T (gumbel_draws), keeping the logits and forming
        q only where it is needed: plain sampling (no top-p, no top-k: the law is
        softmax(logits / T)) over a vocabulary wider than DENSE_UP_TO. At Qwen3's 151,936, 16
        rows cost 2.7 ms this way against 4.8 for a softmax and an inverse CDF; at the embedded
        pair's 4,096 the softmax and the inverse CDF cost 0.4 ms, and they are kept."""
        plain = self.temp > 0 and self.top_p >= 1.0 and not (self.top_k and self.top_k > 0)
        return plain and vocab > DENSE_UP_TO

    def scaled(self, logits: np.ndarray) -> np.ndarray:
        """logits / T, float32: softmax of it is the law when `lazy`."""
        x = np.asarray(logits, np.float32)
        return x if self.temp == 1 else x / np.float32(self.temp)


GREEDY = Sampling()

# A sampled step's random streams, keyed so that sd and mirror draw the same ones and so
# commit the same tokens for a seed: the window of step s by a generator keyed by the (A, c)
# it follows (`window_rng`), its verification by the noise of step s (`step_noise`). Mirror's
# branches of step s - 1 are those windows drawn ahead: a branch's tokens do not depend on how
# far its rollout got (runtime/mirror/draft_worker.py).
INITIAL, WINDOW, NOISE_TAG = 0, 1, 3


def window_rng(seed: int, step: int, prev: tuple[int, int] | None = None) -> np.random.Generator:
    """The generator the window of `step` is drawn with: keyed by the (A, c) of step - 1
    that it follows (`prev`; None for the first window)."""
    key = [seed, step, INITIAL] if prev is None else [seed, step, WINDOW, *prev]
    return np.random.default_rng(key)


def step_noise(seed: int, step: int, gamma: int, vocab: int) -> tuple[np.ndarray, GumbelField]:
    """The verifier's noise for `step`: u (γ,) uniforms and G, rows 0..γ of standard Gumbel
    noise over the vocabulary, as a field read where needed (kernels/gumbel_field.py): a
    (γ+1) x V table drawn whole cost 10 ms a side at V = 151,936 on this CPU, where the
    message's top-κ and the correction read a few blocks of each row."""
    field = GumbelField(fold(seed, step, NOISE_TAG), gamma + 1, vocab)
    return field.uniforms(gamma), field


def draw(
    logits: np.ndarray, sampling: Sampling, rng, law=None, gumbel: bool = False
) -> tuple[int, np.ndarray | None] | None:
    """One draft token from its logits (V,): (d, q), q the law d was drawn from (None when
    greedy without `law`: greedy verification needs none). `law(q) -> q_hat` replaces q by the
    law the verifier will see (a lossy codec's q̂, SQS §2) before the draw; a law that returns
    None ends the window before any draw (SQS §4's bit budget), and so does this: None.
    gumbel: draw as Mirror-SD's branch waves do (runtime/mirror/draft_worker.py): by
    Gumbel-max where `sampling.lazy` says so, so that a fallback window is the branch's own
    for the same generator."""
    if sampling.greedy:
        if law is None:
            return int(logits.argmax()), None
        q = law(Sampling(1.0).probs(logits))  # a codec that always carries q̂: softmax's
        return None if q is None else (int(logits.argmax()), q)
    q = sampling.probs(logits)
    if gumbel and law is None and sampling.lazy(q.shape[-1]):
        return int(gumbel_draws([rng], sampling.scaled(logits)[None, :])[0]), q
    if law is not None:
        q = law(q)
        if q is None:
            return None
    return int(sample(q, rng.random())), q  # SQS §2: drawn from the q̂ sent


def gumbel_draws(rngs, scores: np.ndarray) -> np.ndarray:
    """One Gumbel-max draw per row of scores (R, V) (Sampling.scaled), row r's noise a
    Gumbel field keyed by a 63-bit draw of rngs[r] (kernels/gumbel_field.py): exact, and it
    reads a few blocks of each row, where the inverse CDF needs the whole normalised law."""
    keys = np.array([int(r.integers(1 << 63)) for r in rngs], np.uint64)
    return GumbelField.of_rows(keys, np.shape(scores)[-1]).top(scores, 1)[0][:, 0]


@dataclass
class StepCall:
    """What make_steps hands a method's `steps` (runtime/decoding/__init__.py): the pair, the
    prompt, the budget, the sampling and its seed, the method's Options, the caches to continue
    (None: fresh ones) and Mirror-SD's timeline."""

    target: object
    draft: object
    seq: list[int]
    max_new: int
    sampling: Sampling
    seed: int
    options: object
    target_cache: object = None
    draft_cache: object = None
    timeline: object = None

    def rng(self) -> np.random.Generator:
        """A generator seeded with the call's seed (the methods that draw from one)."""
        return np.random.default_rng(self.seed)

    def keywords(self, *names: str) -> dict:
        """max_new and sampling as a steps function's keywords, with `names` of seed, rng (a
        generator seeded with the seed), timeline, target_cache and draft_cache."""
        got = {"max_new": self.max_new, "sampling": self.sampling}
        got.update({n: self.rng() if n == "rng" else getattr(self, n) for n in names})
        return got


def option_keywords(options, drop: tuple = (), **renamed: str) -> dict:
    """A method's Options as its steps function's keywords: each field under its own name or
    the one `renamed` gives it (a flag named apart from its keyword), those in `drop` left out.
    The values themselves, not copies (a connection, a controller)."""
    return {
        renamed.get(f.name, f.name): getattr(options, f.name)
        for f in fields(options)
        if f.name not in drop
    }


def no_summary(events, timeline, **run) -> dict:
    """A method that adds nothing to the run's stats beyond the shared figures."""
    return {}


@dataclass
class StepEvent:
    """One decoding step: the tokens it committed and where its time went."""

    tokens: list[int]  # committed this step: accepted drafts + the correction/bonus token
    accepted: int = 0  # draft tokens accepted (A)
    drafted: int = 0  # draft tokens proposed (γ for this step)
    draft_s: float = 0.0
    verify_s: float = 0.0
    extra: dict = field(default_factory=dict)  # strategy-specific (reuse, bytes, ...)


def rewind(cache, keep: int) -> None:
    """Trim `cache` so it holds at most the first `keep` tokens of the sequence."""
    if cache is not None and cache.offset > keep:
        cache.trim(cache.offset - keep)


def last_logits(target, tokens: np.ndarray, cache) -> np.ndarray:
    """Float32 logits (V,) of the last position of `tokens` (1, T), appended to `cache`.

    A prefill (T > 1) on the PyTorch and MLX backends runs the layers and applies the head to
    the last row only, as HF's generate does: the head over every prompt position is T x V
    (for Gemma 3's 262,144 tokens, a 727-token prompt's logits are 762 MB). A target that
    records its hidden states for an MTP head keeps the full forward."""
    T = tokens.shape[1]
    if T > 1 and getattr(target, "logits_last", False):  # the ONNX target: its head on one row
        return target.forward(tokens, cache, last=1)[0, -1]
    if T > 1 and target.backend in ("torch", "mlx") and not getattr(target, "record_hidden", False):
        h = target.forward_layers(tokens, cache, 0, target.config.num_layers)
        return target.head(h[:, -1:])[0, -1]
    return target.forward(tokens, cache)[0, -1]


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens `a` and `b` share: what a cache holding `a` keeps for `b`."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def pending(cache, seq: list[int]) -> list[int]:
    """Tokens of `seq` the cache has not seen yet (at least the last one, to get its logits)."""
    if cache.offset >= len(seq):
        cache.trim(cache.offset - len(seq) + 1)
    return seq[cache.offset :]
