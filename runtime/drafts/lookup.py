"""`--draft lookup`: prompt lookup decoding, as Hugging Face's `prompt_lookup_num_tokens` and
llama.cpp's n-gram drafts do it, with no model.

The last n tokens of the sequence (n from `max_ngram` down to `min_ngram`, the longest that
occurred before) are looked up among the earlier text: the prompt and the answer so far. What
followed them there is the proposal. The index maps every n-gram to the positions right after
it, kept up to date as tokens are committed (O(max_ngram) per token), so a lookup is a dict
read. Several earlier occurrences (the `matches` most recent) are merged into a trie of their
continuations, each node's chance the share of occurrences that agree on it: `sd` takes the
most shared path (ties: the most recent occurrence's), `tree` several branches where the
occurrences disagree. Lossless at every temperature: see runtime/drafts/base.py.
"""

from __future__ import annotations

from kernels.suffix_trie import CountTrie, path_draft, tree_draft
from runtime.config import ModelConfig
from runtime.drafts.base import ModelFreeDraft


class LookupDraft(ModelFreeDraft):
    """Prompt lookup over n-grams of the prompt and the answer so far."""

    name = "lookup"
    # auto's ceiling on drafts per step (devices/model_free_choice.py): a share of a few
    # occurrences is no chance of a long run (one occurrence gives 1.0 all along it)
    alone_gamma = 4

    def __init__(
        self,
        config: ModelConfig,
        max_ngram: int = 3,
        min_ngram: int = 2,
        matches: int = 8,
        min_prob: float = 0.0,
    ):
        super().__init__(config)
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.matches, self.min_prob = matches, min_prob

    def new_index(self) -> dict[tuple, list[int]]:
        return {}  # n-gram -> positions right after its occurrences, oldest first

    def feed(self, index: dict, tokens: list[int], start: int) -> None:
        """Index the n-grams ending at tokens[start:] (the position after each is where what
        followed it starts; it may be the pending token)."""
        lo, hi = self.min_ngram, self.max_ngram
        for i in range(start, len(tokens)):
            for n in range(lo, min(hi, i + 1) + 1):
                index.setdefault(tuple(tokens[i + 1 - n : i + 1]), []).append(i + 1)

    def _trie(self, index: dict, seq: list[int], depth: int) -> CountTrie | None:
        """The continuations of the longest n-gram ending seq that occurred before, merged."""
        for n in range(min(self.max_ngram, len(seq)), self.min_ngram - 1, -1):
            at = index.get(tuple(seq[len(seq) - n :]))
            if not at:
                continue
            trie = CountTrie()
            for p in reversed(at[-self.matches :]):  # most recent first: it wins ties
                node = 0
                for t in seq[p : p + depth]:
                    node = trie.bump(node, t)
            return trie
        return None

    def best_chain(
        self, index: dict, seq: list[int], max_len: int
    ) -> tuple[list[int], list[float]]:
        trie = self._trie(index, seq, max_len)
        return ([], []) if trie is None else path_draft(trie, 0, max_len, self.min_prob)

    def best_tree(
        self, index: dict, seq: list[int], max_nodes: int, max_depth: int
    ) -> tuple[list[int], list[int], list[float]]:
        trie = self._trie(index, seq, max_depth)
        if trie is None:
            return [], [], []
        return tree_draft(trie, 0, max_nodes, max_depth, self.min_prob)
