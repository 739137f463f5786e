"""A depth-limited suffix trie with occurrence counts, and drafts read from it (SuffixDecoding).

`SuffixTrie` holds every substring of length <= `depth` of the texts fed to it, each node
counting the substring's occurrences (`count`) and how many of them the text continued
(`cont`, the sum of its children's counts). Feeding a token costs O(depth): the nodes of
the text's current suffixes (`active`) each step to their child. Several texts (a corpus's
documents, earlier chats) go into one trie with `new_text()` between them, so no substring
spans two. This is the structure SuffixDecoding (Oliaro et al., 2024; Snowflake's
ArcticInference) keeps: a suffix tree cut at a depth, stored uncompressed for simple
incremental updates. `reference_counts` is its brute-force twin (STYLE 6).

`path_draft` and `tree_draft` read a speculation from a matched node: the chance of each
continuation is estimated as count(child) / cont(node), multiplied along the path; a chain
follows the most frequent child, a tree adds the most probable nodes first (best-first), and
both stop below `min_prob` or at `max_tokens` (SuffixDecoding §3, its max_spec = α·m rule is
the caller's). Pure Python over ints: what the per-step budget allows (no model runs here).
"""

from __future__ import annotations

import heapq
from collections import Counter


class CountTrie:
    """Node 0 is the root; node i has token tok[i], parent par[i], depth dep[i], children
    kids[i] (token -> node), occurrences count[i] and continued occurrences cont[i]."""

    def __init__(self) -> None:
        self.kids: list[dict[int, int]] = [{}]
        self.tok, self.par, self.dep = [-1], [-1], [0]
        self.count, self.cont = [0], [0]

    def __len__(self) -> int:
        return len(self.tok)

    def bump(self, node: int, token: int, by: int = 1) -> int:
        """The child of `node` for `token` (made if new), its count and node's cont raised."""
        child = self.kids[node].get(token)
        if child is None:
            child = len(self.tok)
            self.kids[node][token] = child
            self.kids.append({})
            self.tok.append(token)
            self.par.append(node)
            self.dep.append(self.dep[node] + 1)
            self.count.append(0)
            self.cont.append(0)
        self.count[child] += by
        self.cont[node] += by
        return child

    def walk(self, tokens, node: int = 0) -> int | None:
        """The node reached from `node` along `tokens`, or None where the path ends."""
        for t in tokens:
            node = self.kids[node].get(t)
            if node is None:
                return None
        return node


class SuffixTrie(CountTrie):
    """Every substring of length <= depth of the texts fed, counted (see the module doc)."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"depth must be at least 1 (got {depth})")
        self.depth = depth
        self.active = [0]  # nodes of the current text's suffixes shorter than depth, root first
        self.fed = 0  # tokens fed, over all texts

    def new_text(self) -> None:
        """Start another text: later substrings do not span the boundary."""
        self.active = [0]

    def extend(self, tokens) -> None:
        """Feed tokens to the current text. O(depth) each."""
        d, kids, count, cont, dep = self.depth, self.kids, self.count, self.cont, self.dep
        active = self.active
        for t in tokens:  # CountTrie.bump inlined: this loop is the draft's main cost
            t = int(t)
            nxt = [0]
            for node in active:
                child = kids[node].get(t)
                if child is None:
                    child = len(count)
                    kids[node][t] = child
                    kids.append({})
                    self.tok.append(t)
                    self.par.append(node)
                    dep.append(dep[node] + 1)
                    count.append(0)
                    cont.append(0)
                count[child] += 1
                cont[node] += 1
                if dep[child] < d:
                    nxt.append(child)
            count[0] += 1  # the empty string occurs once per token (ends there)
            active = nxt
        self.active = active
        self.fed += len(tokens)

    def suffix_matches(self, last: int | None = None, longest: int | None = None) -> list[int]:
        """Nodes of the current text's suffixes that occur in the trie, shortest first,
        excluding the empty one; `last`, when given, is one more (pending) token appended to
        the text first (not fed). `longest` caps the suffix length."""
        if last is None:
            out = self.active[1:]
        else:
            out = [c for c in (self.kids[n].get(last) for n in self.active) if c is not None]
        return out if longest is None else [n for n in out if self.dep[n] <= longest]

    def match_context(self, context: list[int], longest: int) -> list[int]:
        """Nodes of context's suffixes of length 1..longest found in the trie, shortest first
        (walked from the root: for a trie fed other texts, as a corpus). A suffix is found only
        if every shorter one is, so the walk stops at the first miss."""
        out = []
        for m in range(1, min(longest, len(context), self.depth) + 1):
            node = self.walk(context[len(context) - m :])
            if node is None:
                break
            out.append(node)
        return out


def path_draft(
    trie: CountTrie, node: int, max_tokens: int, min_prob: float
) -> tuple[list[int], list[float]]:
    """The chain of most frequent continuations from `node` (ties: the child seen first), and
    each token's estimated chance of being reached; stops at max_tokens, at a node the text
    never continued, or when the chance falls below min_prob."""
    toks, probs, p = [], [], 1.0
    while len(toks) < max_tokens and trie.cont[node] > 0:
        kids = trie.kids[node]
        child = max(kids.values(), key=trie.count.__getitem__)
        p *= trie.count[child] / trie.cont[node]
        if p < min_prob:
            break
        toks.append(trie.tok[child])
        probs.append(p)
        node = child
    return toks, probs


def tree_draft(
    trie: CountTrie, node: int, max_tokens: int, max_depth: int, min_prob: float
) -> tuple[list[int], list[int], list[float]]:
    """Best-first: up to max_tokens nodes below `node`, most probable first, none deeper than
    max_depth or less probable than min_prob. Returns (tokens, parents (-1: the root), chance
    of each) in the order added: parents come before children."""
    toks: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    heap = [(-1.0, 0, node, -1, 0)]  # (-chance, order, trie node, tree parent, depth)
    order = 1
    while heap and len(toks) < max_tokens:
        negp, _, n, parent, depth = heapq.heappop(heap)
        if n != node:
            parent_index = len(toks)
            toks.append(trie.tok[n])
            parents.append(parent)
            probs.append(-negp)
            parent = parent_index
        if depth >= max_depth or trie.cont[n] == 0:
            continue
        for child in trie.kids[n].values():
            p = -negp * trie.count[child] / trie.cont[n]
            if p >= min_prob:
                heapq.heappush(heap, (-p, order, child, parent, depth + 1))
                order += 1
    return toks, parents, probs


def reference_counts(texts: list[list[int]], depth: int) -> tuple[Counter, Counter]:
    """Brute force: (occurrences, continued occurrences) of every substring of length 1..depth
    of `texts` (as tuples); substrings never span two texts."""
    occ, cont = Counter(), Counter()
    for text in texts:
        for i in range(len(text)):
            for m in range(1, min(depth, len(text) - i) + 1):
                s = tuple(text[i : i + m])
                occ[s] += 1
                if i + m < len(text) and m < depth:
                    cont[s] += 1
    return occ, cont
