"""`--prompts chat` (apps/prompts/chat/chat.jsonl): Spec-Bench's six categories for chat
models, 6-10 prompts each; summarization and RAG prompts carry a passage of a few hundred
words; the default prompt set does not pick it up."""

from collections import Counter

from apps.bench.prompt_set import load_prompts

CATEGORIES = {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}


def test_chat_set_covers_spec_benchs_six_categories():
    recs = load_prompts("chat")
    counts = Counter(r["category"] for r in recs)
    assert set(counts) == CATEGORIES
    assert all(6 <= n <= 10 for n in counts.values()), counts
    assert all(len(r["turns"]) == 2 for r in recs if r["category"] == "mt_bench")
    for r in recs:
        if r["category"] in ("summarization", "rag"):
            assert len(r["turns"][0].split()) >= 250, r["question_id"]
    assert len({r["question_id"] for r in recs}) == len(recs)


def test_default_set_leaves_the_chat_set_out():
    assert not {r["category"] for r in load_prompts(None)} & CATEGORIES
    assert [r["category"] for r in load_prompts("chat", categories=["rag"])] == ["rag"] * 8
