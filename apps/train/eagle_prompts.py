"""Training prompts for the feature-level draft head (`python -m apps.train eagle`), built offline.

The head is distilled from the target's own answers (self-distillation), so the prompts only
need to make the target talk the way it talks in a chat: they are single user turns in
Spec-Bench's categories (summarize, translate, answer, explain, continue, math word problems,
write, answer from a document), filled from text that ships here (the docstrings and source of
the Python standard library) and from topic lists and random numbers written below. None is
taken from the held-out chat set (apps/prompts/chat/chat.jsonl, written by hand):
`build_prompts` drops any prompt equal to one of its turns, and the sources differ.
Deterministic for a seed.
"""

from __future__ import annotations

import ast
import json
import random
import sys
from pathlib import Path

TOPICS = (
    "photosynthesis", "the water cycle", "inflation", "compound interest", "vaccines",
    "black holes", "plate tectonics", "the French Revolution", "the printing press",
    "machine learning", "recycling", "climate change", "the immune system", "democracy",
    "the stock market", "renewable energy", "sleep", "meditation", "the Roman Empire",
    "electric cars", "volcanoes", "the internet", "coral reefs", "bees", "the moon landing",
    "supply and demand", "a healthy diet", "public transport", "urban gardening", "jazz",
    "the Olympic Games", "chess", "coffee", "tea ceremonies", "the Great Wall of China",
    "antibiotics", "DNA", "earthquakes", "rainforests", "the Renaissance", "blockchains",
    "password security", "time management", "remote work", "learning a language",
    "the human heart", "glaciers", "solar panels", "wind turbines", "the Silk Road",
    "bread baking", "composting", "electricity", "magnets", "gravity", "rainbows",
    "the seasons", "tides", "dinosaurs", "the Industrial Revolution", "a job interview",
    "saving money", "running a marathon", "camping", "birdwatching", "origami", "opera",
    "the periodic table", "friction", "sound waves", "microplastics", "honey", "libraries",
    "museums", "volunteering", "first aid", "bicycles", "trains", "airplanes", "submarines",
)  # fmt: skip
LANGS = ("French", "Spanish", "German", "Italian", "Portuguese", "Dutch")
PEOPLE = ("a colleague", "my landlord", "a teacher", "a customer", "my neighbour",
          "the hotel", "a friend", "my manager", "the city council", "a supplier")  # fmt: skip
ASKS = ("asking for a meeting next week", "apologising for a late reply",
        "thanking them for their help", "asking for a refund", "reporting a broken heater",
        "inviting them to a small party", "asking for feedback on a report",
        "asking to change a booking")  # fmt: skip
NAMES = ("Anna", "Ben", "Carla", "David", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jonas")
ITEMS = (("apples", "kilogram"), ("notebooks", "notebook"), ("tickets", "ticket"),
         ("pens", "pen"), ("plants", "plant"), ("cakes", "cake"), ("books", "book"))  # fmt: skip


def _docs(limit_files: int, rng: random.Random) -> list[tuple[str, str, str]]:
    """(name, docstring, source) of documented functions and classes in the stdlib."""
    root = Path(sys.modules["json"].__file__).parent.parent
    files = sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))
    files += sorted(root.glob("*/__init__.py"))
    rng.shuffle(files)
    out = []
    for f in files[:limit_files]:
        try:
            text = f.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                src = ast.get_source_segment(text, node) or ""
                if doc and 120 <= len(doc) <= 1500 and len(src) <= 1500:
                    out.append((f"{f.stem}.{node.name}", doc.strip(), src))
    return out


def _first_sentence(doc: str) -> str:
    s = " ".join(doc.split())
    return s.split(". ")[0].rstrip(".") + "."


def _math(rng: random.Random) -> str:
    who, (items, unit) = rng.choice(NAMES), rng.choice(ITEMS)
    a, b, c = rng.randint(2, 12), rng.randint(2, 9), rng.randint(10, 90)
    forms = (
        f"{who} buys {a} {items} at {b} dollars per {unit} and pays with a {10 * (a * b // 10 + 1)}"
        f" dollar note. How much change does {who} get? Explain step by step.",
        f"A train travels at {c} km per hour for {a} hours and then at {c + 10} km per hour for "
        f"{b} hours. How far does it travel in total? Show your reasoning.",
        f"{who} has {c} {items}, gives away a third of them rounded down, and then buys {a} "
        f"more. How many {items} does {who} have now? Think step by step.",
        f"A rectangle is {a} cm wide and {c} cm long. What are its area and its perimeter? "
        "Explain your answer.",
        f"A class has {c} students; {b * 5} percent of them walk to school. How many walk, and "
        "how many do not? Show the calculation.",
        f"If {a} workers build a wall in {b * 2} days, how long would {a * 2} workers take, "
        "working at the same rate? Explain.",
    )
    return rng.choice(forms)


def _generic(rng: random.Random) -> str:
    t, t2 = rng.sample(TOPICS, 2)
    forms = (
        f"Explain {t} in simple terms.",
        f"What is the difference between {t} and {t2}?",
        f"Give me three practical tips about {t}.",
        f"Why is {t} important? Answer briefly.",
        f"Write a short paragraph about {t} for a school newsletter.",
        f"Write a short, polite email to {rng.choice(PEOPLE)} {rng.choice(ASKS)}.",
        f"What are the advantages and disadvantages of {t}?",
        f"Write a short story of about five sentences that involves {t}.",
        f"I want to learn about {t}. Where should I start?",
        f"Summarize what most people should know about {t} in three bullet points.",
    )
    return rng.choice(forms)


def _from_doc(rng: random.Random, name: str, doc: str, src: str) -> str:
    short = name.split(".")[-1]
    forms = (
        f"Summarize the following text in a few sentences.\n\n{doc}",
        f"Explain what the following Python code does.\n\n```python\n{src}\n```",
        f"Translate the following sentence into {rng.choice(LANGS)}.\n\n{_first_sentence(doc)}",
        f"Answer the question using only the document below.\n\nDocument:\n{doc}\n\n"
        f"Question: what does `{short}` do, and what does it return?",
        f"Continue the following text.\n\n{doc[: len(doc) // 2]}",
        f"Write a Python function that does the following: {_first_sentence(doc)}",
        f"Read this documentation and list its key points.\n\n{doc}",
    )
    return rng.choice(forms)


def heldout_turns(path: Path) -> set[str]:
    """Every turn of the held-out chat set, to keep out of training."""
    if not path.is_file():
        return set()
    return {
        t
        for line in path.read_text().splitlines()
        if line.strip()
        for t in json.loads(line)["turns"]
    }


def build_prompts(
    n: int, seed: int = 0, heldout: Path | None = None, doc_files: int = 120
) -> list[str]:
    """`n` distinct single-turn user prompts: ~45 % from stdlib docs, ~35 % generic chat
    topics, ~20 % math word problems; none equal to a held-out chat turn. `doc_files`: how
    many stdlib files the docstrings come from (parsing them is most of the cost)."""
    rng = random.Random(seed)
    docs = _docs(doc_files, rng)
    banned = heldout_turns(heldout) if heldout else set()
    seen, out = set(banned), []
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        r = rng.random()
        if r < 0.45 and docs:
            p = _from_doc(rng, *rng.choice(docs))
        elif r < 0.8:
            p = _generic(rng)
        else:
            p = _math(rng)
        if p not in seen:
            seen.add(p)
            out.append(p)
    return out
