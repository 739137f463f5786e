"""The suffix trie (kernels/suffix_trie.py) against brute force on random strings: counts and
continued counts of every substring after incremental updates over several texts, matched
suffixes, and the drafts read from it; and the lookup draft's proposals against a plain
search of earlier n-gram occurrences."""

import numpy as np
import pytest

from kernels.suffix_trie import SuffixTrie, path_draft, reference_counts, tree_draft
from runtime.config import ModelConfig
from runtime.drafts.lookup import LookupDraft


def random_texts(rng, n_texts, alphabet, max_len):
    return [rng.integers(0, alphabet, rng.integers(1, max_len)).tolist() for _ in range(n_texts)]


@pytest.mark.parametrize("seed", range(6))
def test_counts_match_brute_force_after_incremental_updates(seed):
    rng = np.random.default_rng(seed)
    depth = int(rng.integers(1, 7))
    texts = random_texts(rng, 3, int(rng.integers(2, 5)), 40)
    trie = SuffixTrie(depth)
    for t in texts:  # each text fed in random chunks
        trie.new_text()
        cuts = sorted(set(rng.integers(0, len(t) + 1, 3).tolist()) | {0, len(t)})
        for a, b in zip(cuts, cuts[1:], strict=False):
            trie.extend(t[a:b])
    occ, cont = reference_counts(texts, depth)
    nodes = {}
    for i in range(1, len(trie)):  # every node's string, from its parents
        s, n = [], i
        while n:
            s.append(trie.tok[n])
            n = trie.par[n]
        nodes[tuple(reversed(s))] = i
    assert set(nodes) == set(occ)  # exactly the substrings up to depth
    for s, i in nodes.items():
        assert trie.count[i] == occ[s], s
        assert trie.cont[i] == cont[s], s
        assert trie.cont[i] == sum(trie.count[c] for c in trie.kids[i].values())
    assert trie.count[0] == sum(map(len, texts))


@pytest.mark.parametrize("seed", range(6))
def test_suffix_matches_are_the_suffixes_that_occur(seed):
    rng = np.random.default_rng(100 + seed)
    depth = 5
    corpus = random_texts(rng, 2, 3, 30)
    text = rng.integers(0, 3, 25).tolist()
    occ_all, _ = reference_counts(corpus, depth)
    trie, seq_trie = SuffixTrie(depth), SuffixTrie(depth)
    for t in corpus:
        trie.new_text()
        trie.extend(t)
    got = [trie.dep[n] for n in trie.match_context(text, 4)]
    want = []
    for m in range(1, 5):
        if tuple(text[-m:]) not in occ_all:
            break
        want.append(m)
    assert got == want
    # the sequence's own trie holds text[:-1]; text[-1] is pending
    seq_trie.extend(text[:-1])
    occ_seq, _ = reference_counts([text[:-1]], depth)
    got = {seq_trie.dep[n] for n in seq_trie.suffix_matches(text[-1])}
    want = {m for m in range(1, depth + 1) if tuple(text[-m:]) in occ_seq}
    assert got == want


def test_path_draft_follows_the_most_frequent_continuation():
    trie = SuffixTrie(8)
    trie.extend([1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 9, 1, 2])
    node = trie.walk([1, 2])
    toks, probs = path_draft(trie, node, 5, 0.0)
    # after "1 2": 3 twice, 4 once (the last "1 2" has no continuation yet)
    assert toks[:3] == [3, 9, 1] and probs[0] == pytest.approx(2 / 3)
    assert probs == sorted(probs, reverse=True)
    assert path_draft(trie, node, 5, 0.7) == ([], [])  # 2/3 < 0.7: nothing proposed


def test_tree_draft_is_best_first_with_chances_from_counts():
    trie = SuffixTrie(8)
    trie.extend([1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 3, 8])
    toks, parents, probs = tree_draft(trie, trie.walk([1, 2]), 4, 3, 0.0)
    # after "1 2": 3 (2 of 3), 4 (1 of 3); after "1 2 3": 9 and 8 once each (1/3 of the way);
    # ties go to the node queued first, so 4 comes before 3's children
    assert toks == [3, 4, 9, 8] and parents == [-1, -1, 0, 0]
    assert probs == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])
    assert tree_draft(trie, trie.walk([1, 2]), 10, 1, 0.5) == ([3], [-1], [pytest.approx(2 / 3)])


def lookup_reference(seq, max_ngram, min_ngram, matches, n):
    """Plain search: the longest n-gram ending seq that occurred before; among its `matches`
    latest occurrences, follow the continuation most of them share (ties: the latest)."""
    for g in range(min(max_ngram, len(seq)), min_ngram - 1, -1):
        at = [p for p in range(g, len(seq)) if seq[p - g : p] == seq[len(seq) - g :]]
        if not at:
            continue
        conts = [seq[p : p + n] for p in reversed(at[-matches:])]
        out = []
        while len(out) < n:
            live = [c for c in conts if c[: len(out)] == out and len(c) > len(out)]
            if not live:
                break
            votes = {}
            for c in live:
                votes[c[len(out)]] = votes.get(c[len(out)], 0) + 1
            out.append(max(votes, key=votes.get))  # dict order: the latest occurrence first
        return out
    return []


@pytest.mark.parametrize("seed", range(8))
def test_lookup_chain_matches_a_plain_search(seed):
    rng = np.random.default_rng(200 + seed)
    cfg = ModelConfig.__new__(ModelConfig)  # the draft reads only the vocabulary and context
    draft = LookupDraft(cfg, max_ngram=3, min_ngram=1, matches=4)
    seq = rng.integers(0, 4, 60).tolist()
    cache = draft.new_cache()
    for end in range(2, len(seq) + 1, 3):  # the index follows the growing sequence
        got = draft.chain(cache, seq[:end], 6)
        assert got == lookup_reference(seq[:end], 3, 1, 4, 6), end
    cache.trim(30)  # a rewind below what it read: rebuilt on the next proposal
    assert draft.chain(cache, seq[:40], 6) == lookup_reference(seq[:40], 3, 1, 4, 6)
