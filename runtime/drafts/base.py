"""What `sd` and `tree` call on a draft that runs no model, and why it stays lossless.

A model-free draft proposes tokens read from text (the prompt, the answer so far, a corpus):
`chain(cache, seq, n)` gives up to n tokens to continue `seq`, `tree(cache, seq, nodes,
depth)` several continuations at once (tokens, parents, estimated chances). It may propose
fewer tokens than asked, or none, when nothing in the text matches: the step is then the
target's own step (one token), so a draft with nothing to say costs next to nothing. Its
cache (`ProposalCache`) is the draft's index over the sequence; like a model's KV cache it
holds every token but the last (pending) one, so `sd`'s and `tree`'s rewinds to the
committed sequence leave it alone, and a rewind below what it holds (a chat's edited history)
rebuilds the index on the next proposal.

Lossless at every temperature. The proposal is deterministic given the sequence, so the law
each draft token was drawn from is the point mass q = δ_d. The acceptance rule then reads:
accept d with probability min(1, p(d) / q(d)) = p(d), and on rejection draw the correction
from norm(max(p - δ_d, 0)), which is p with d removed and renormalised
(kernels/verify.py, with `DeltaRows` as q); the committed token's law is
p(d)·δ_d + (1 - p(d))·p(· | ≠ d) = p. A tree's siblings are tried in turn against the
residual left by the ones rejected before them (kernels/tree_verify.py with q = None: point
masses). At temperature 0 the target's argmax decides alone, so the output is `ar`'s.
"""

from __future__ import annotations

import numpy as np

from runtime.config import ModelConfig


def is_model_free(draft) -> bool:
    """Whether `draft` is a model-free draft (proposes from text, runs no model)."""
    return getattr(draft, "model_free", False)


class DeltaRows:
    """q for a deterministic window: row i is the point mass on token d_i. Coded rows as
    kernels/verify.verify_sampling takes them: q_i(d_i) = 1, a row built only if rejected."""

    def __init__(self, tokens: list[int], vocab: int):
        self.tokens, self.vocab = list(tokens), vocab
        self.token_probs = np.ones(len(tokens), np.float32)

    def __len__(self) -> int:
        return len(self.tokens)

    def row(self, i: int) -> np.ndarray:
        q = np.zeros(self.vocab, np.float32)
        q[self.tokens[i]] = 1.0
        return q


class TokenCache:
    """A one-row cache as long as the tokens it has read (`tokens`, set by the subclass):
    `trim` forgets the last ones and tells `dropped` what the subclass keeps beside them."""

    is_trimmable = True
    tokens: list[int]

    @property
    def offset(self) -> int:
        return len(self.tokens)

    @property
    def batch(self) -> int:
        return 1

    def trim(self, n: int) -> int:
        n = max(0, min(n, self.offset))
        self.tokens = self.tokens[: self.offset - n]
        self.dropped(n)
        return n

    def dropped(self, n: int) -> None:
        """`trim` has just forgotten the last `n` tokens (maybe none)."""


class ProposalCache(TokenCache):
    """The draft's state over one sequence: the tokens it has read (all but the pending last
    one) and the draft's index over them (`index`, built by the draft). Trimming forgets
    tokens; the index is rebuilt on the next proposal."""

    def __init__(self, draft: ModelFreeDraft):
        self.draft = draft
        self.tokens: list[int] = []
        self.index = draft.new_index()
        self.stale = False

    def dropped(self, n: int) -> None:
        self.stale = self.stale or n > 0

    def sync(self, seq: list[int]) -> None:
        """Read seq[:-1] into the index (only what is new, unless a trim or another sequence
        made it stale)."""
        body = seq[:-1]
        n = len(self.tokens)
        if self.stale or body[:n] != self.tokens:
            self.index = self.draft.new_index()
            self.tokens, n, self.stale = [], 0, False
        if len(body) > n:
            self.draft.feed(self.index, body, n)
            self.tokens = list(body)


class ModelFreeDraft:
    """Base of the model-free drafts: a draft object with the target's vocabulary and context,
    no weights. Subclasses give `new_index()`, `feed(index, tokens, start)` (read
    tokens[start:] into the index), `best_chain(index, seq, max_len)` (tokens, chances) and
    `best_tree(index, seq, max_nodes, max_depth)` (what `scored_chain` and `tree` return)."""

    model_free = True
    supports_layer_range = False
    reads_target_hidden = False
    backend = "none"
    name = "model-free"

    def __init__(self, config: ModelConfig):
        self.config = config  # the target's: same vocabulary, same context

    def new_cache(self, batch: int = 1) -> ProposalCache:
        from runtime.errors import DuetError

        if batch != 1:
            raise DuetError(f"--draft {self.name} proposes for one sequence (no branch rows)")
        return ProposalCache(self)

    def forward(self, *a, **k):
        from runtime.errors import DuetError

        raise DuetError(f"--draft {self.name} runs no model: use it with --method sd or tree")

    def chain(self, cache: ProposalCache, seq: list[int], max_len: int) -> list[int]:
        """Up to max_len tokens to continue seq (maybe none)."""
        return self.scored_chain(cache, seq, max_len)[0]

    def scored_chain(
        self, cache: ProposalCache, seq: list[int], max_len: int
    ) -> tuple[list[int], list[float]]:
        """`chain`'s tokens and each one's estimated chance along the path (how often the text
        continued the match that way, multiplied): their sum is the tokens it expects accepted."""
        if max_len < 1 or len(seq) < 2:
            return [], []
        cache.sync(seq)
        return self.best_chain(cache.index, seq, max_len)

    def tree(
        self, cache: ProposalCache, seq: list[int], max_nodes: int, max_depth: int
    ) -> tuple[list[int], list[int], list[float]]:
        """Up to max_nodes tokens in a tree (tokens, parents (-1: root), chances), parents
        before children, the most likely first among siblings."""
        if max_nodes < 1 or max_depth < 1 or len(seq) < 2:
            return [], [], []
        cache.sync(seq)
        return self.best_tree(cache.index, seq, max_nodes, max_depth)


def chain_window(
    draft: ModelFreeDraft, cache, seq: list[int], gamma: int, sampling
) -> tuple[list[int], object]:
    """sd's draft window from a model-free draft: (tokens, q), q the point masses (DeltaRows)
    when sampling, an empty array when greedy (greedy verification needs none)."""
    toks = draft.chain(cache, seq, gamma)
    if sampling.greedy:
        return toks, np.zeros((0, draft.config.vocab_size), np.float32)
    return toks, DeltaRows(toks, draft.config.vocab_size)


def draft_tree(draft: ModelFreeDraft, cache, seq: list[int], max_nodes: int, max_depth: int):
    """tree's DraftTree from a model-free draft, nodes in preorder (first-child chain first),
    scored by the log of their estimated chance (what EAGLE-2's reranking reads)."""
    from runtime.decoding.tree_draft import DraftTree

    toks, parents, probs = draft.tree(cache, seq, max_nodes, max_depth)
    t = DraftTree()
    rank: dict[int, int] = {}
    for tok, par, p in zip(toks, parents, probs, strict=True):
        t.tokens.append(int(tok))
        t.parents.append(par)
        t.scores.append(float(np.log(max(p, 1e-30))))
        t.depths.append(1 if par < 0 else t.depths[par] + 1)
        t.ranks.append(rank.get(par, 0))
        rank[par] = rank.get(par, 0) + 1
    return t.prune(len(t))
