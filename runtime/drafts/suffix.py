"""`--draft suffix`: SuffixDecoding (Oliaro et al., 2024) with no model: speculation read from
suffix tries over the prompt, the answer so far (earlier turns of a chat are part of its
sequence) and, with `--draft suffix:FILE`, a corpus file.

Each step the sequence's suffixes of length m = 1..`max_match` are matched in two tries
(kernels/suffix_trie.py): the sequence's own (fed as tokens are committed, O(depth) each) and
the corpus's (built once). From each matched node a proposal is read: a chain of the most
frequent continuations (`sd`), or a best-first tree (`tree`), each token's chance estimated
as how often the text continued the match that way, multiplied along the path; it stops below
`min_prob` and at `factor`·m + `offset` tokens (the speculation length grows with the match
length: SuffixDecoding's MAX_SPEC = α·p). The proposal with the largest expected number of
accepted tokens (the sum of its chances) wins; ties go to the longer match. No match: no
proposal, and the step is the target's own. Lossless at every temperature: see
runtime/drafts/base.py.
"""

from __future__ import annotations

from kernels.suffix_trie import SuffixTrie, path_draft, tree_draft
from runtime.config import ModelConfig
from runtime.drafts.base import ModelFreeDraft


class SuffixDraft(ModelFreeDraft):
    """Suffix-trie speculation over the sequence and an optional corpus."""

    name = "suffix"

    def __init__(
        self,
        config: ModelConfig,
        depth: int = 32,
        max_match: int = 16,
        factor: float = 1.0,
        offset: float = 0.0,
        min_prob: float = 0.1,
    ):
        super().__init__(config)
        self.depth, self.max_match = depth, max_match
        self.factor, self.offset, self.min_prob = factor, offset, min_prob
        self.corpus: SuffixTrie | None = None

    def add_corpus(self, texts: list[list[int]]) -> None:
        """Feed texts (token lists) to the corpus trie, one document each."""
        if self.corpus is None:
            self.corpus = SuffixTrie(self.depth)
        for t in texts:
            self.corpus.new_text()
            self.corpus.extend(t)

    def new_index(self) -> SuffixTrie:
        return SuffixTrie(self.depth)

    def feed(self, index: SuffixTrie, tokens: list[int], start: int) -> None:
        index.extend(tokens[start:])

    def _matches(self, index: SuffixTrie, seq: list[int]):
        """(trie, node) for every matched suffix, shortest first within each trie."""
        out = [(index, n) for n in index.suffix_matches(seq[-1], self.max_match)]
        if self.corpus is not None:
            out += [(self.corpus, n) for n in self.corpus.match_context(seq, self.max_match)]
        return out

    def _cap(self, trie: SuffixTrie, node: int, limit: int) -> int:
        return min(limit, int(self.factor * trie.dep[node] + self.offset + 1e-6))

    def best_chain(
        self, index: SuffixTrie, seq: list[int], max_len: int
    ) -> tuple[list[int], list[float]]:
        best, score = ([], []), 0.0
        for trie, node in self._matches(index, seq):
            if trie.cont[node] == 0:
                continue
            toks, probs = path_draft(trie, node, self._cap(trie, node, max_len), self.min_prob)
            s = sum(probs)
            if toks and s >= score:
                best, score = (toks, probs), s
        return best

    def best_tree(
        self, index: SuffixTrie, seq: list[int], max_nodes: int, max_depth: int
    ) -> tuple[list[int], list[int], list[float]]:
        best, score = ([], [], []), 0.0
        for trie, node in self._matches(index, seq):
            if trie.cont[node] == 0:
                continue
            n = self._cap(trie, node, max_nodes)
            got = tree_draft(trie, node, n, max_depth, self.min_prob)
            s = sum(got[2])
            if got[0] and s >= score:
                best, score = got, s
        return best
