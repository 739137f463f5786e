"""The feature-level head's training data: the target's own answers and its features, cached.

Phase 1 (self-distillation, EAGLE's data): the target answers the training prompts
(apps/train/eagle_prompts.py) with its chat template applied, greedily, batched (Hugging Face
`generate` with left padding). The teacher's features are read off the same passes (computed
once, no second forward): per position, the outputs of the tapped layers (the residual
stream after those decoder layers: what `TorchCausalLM` records at inference when a head asks
for `record_layers`) and the top-k of the target's next-token log-probabilities (T = 1, from
its final hidden state). Each batch appends one shard to DATA/, so a time budget can stop the
phase anywhere and a rerun goes on where it stopped; training then reads only the shards and
never runs the target.

Self-written prompts (`--self-prompts`): Magpie's recipe (Xu et al., 2024, "Magpie: Alignment
Data Synthesis from Scratch by Prompting Aligned LLMs with Nothing"): the target is given its
chat template only up to where a user's words begin and samples them itself (T = 1, top-p
0.95), which yields the questions a chat model expects, in its own distribution, with no
corpus. Template prompts alone (apps/train/eagle_prompts.py) taught SmolLM2's head 0.60 top-1
agreement on held-out prompts of the same templates but 0.42 on the hand-written chat set. Once
answers are cached, a share of the self-written prompts are document tasks over the target's
own earlier answers (summarize, answer from the document, list key points, rewrite), the
prose the chat set's summarization and retrieval questions hold. The whole prompt list is kept
in DATA/plan.jsonl, so a rerun answers the same prompts in the same order. Measured on
SmolLM2: 1,000 of them (88k answer tokens more) moved the head's tokens per step on the chat set
from 1.67 to 1.70 (docs/benchmarks.md), so `--self-prompts` stays off by default.

Shard i (DATA/shard_00000.pt): ids (N,) int32 over its sequences laid end to end, starts (S+1,),
prompt_lens (S,), taps (N, n_taps * H) float16, top_ids (N, k) int32, top_lp (N, k) float16.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from runtime.drafts.head.torch import tap_layers

SHARD = "shard_{:05d}.pt"


def shards(data: Path) -> list[Path]:
    return sorted(data.glob("shard_*.pt"))


def done_prompts(data: Path) -> int:
    """How many prompts the shards in DATA already hold (they are taken in order)."""
    meta = data / "shards.jsonl"
    if not meta.is_file():
        return 0
    return sum(json.loads(line)["n"] for line in meta.read_text().splitlines() if line.strip())


def query_prefix(tmpl) -> list[int]:
    """The tokens the chat template puts before a user's words (Magpie's pre-query template):
    the common prefix of two rendered one-turn chats."""
    a = tmpl.render([{"role": "user", "content": "Hello there, friend"}])
    b = tmpl.render([{"role": "user", "content": "7 + 5 = ?"}])
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a[:n]


@torch.inference_mode()
def self_prompts(
    model,
    tok,
    tmpl,
    n: int,
    *,
    seed: int,
    batch: int,
    eos: set[int],
    pad: int,
    banned: set[str] = frozenset(),
    max_len: int = 64,
    deadline: float | None = None,
    progress=None,
) -> list[str]:
    """Up to `n` distinct user prompts the target writes itself after its template's pre-query
    prefix (Magpie), sampled at T = 1, top-p 0.95: only those that end (an end id within
    `max_len` tokens), hold at least three words and are not in `banned`."""
    prefix = query_prefix(tmpl)
    if not prefix:
        from runtime.errors import DuetError

        raise DuetError("--self-prompts: the chat template puts nothing before a user's words")
    g = torch.Generator().manual_seed(seed)
    out, seen, rounds = [], set(banned), 0
    while len(out) < n and rounds < 4 * n // batch + 4:
        if deadline is not None and time.monotonic() >= deadline:
            break
        rounds += 1
        torch.manual_seed(int(torch.randint(2**31 - 1, (), generator=g)))
        x = torch.tensor([prefix] * batch)
        gen = model.generate(
            input_ids=x,
            attention_mask=torch.ones_like(x),
            do_sample=True,
            temperature=1.0,
            top_p=0.95,
            max_new_tokens=max_len,
            eos_token_id=sorted(eos),
            pad_token_id=pad,
        )
        got = 0
        for row in gen[:, len(prefix) :].tolist():
            end = next((i for i, t in enumerate(row) if t in eos), None)
            text = tok.decode(row[:end]).strip() if end is not None else ""
            if len(text.split()) >= 3 and text not in seen and len(out) < n:
                seen.add(text)
                out.append(text)
                got += 1
        if progress is not None:
            progress(got)
    return out


DOC_FORMS = (
    "Summarize the following text in a few sentences.\n\n{doc}",
    "Read the text below and list its key points.\n\n{doc}",
    "Answer the question using only the information in the document below.\n\nDocument:\n{doc}"
    "\n\nQuestion: {q}",
    "Rewrite the following text so that it is shorter and more formal.\n\n{doc}",
    "Summarize the following text in one paragraph for a busy reader.\n\n{doc}",
)
DOC_QUESTIONS = (
    "What is the main point of the document?", "What does the document recommend doing first?",
    "Which numbers or names does the document mention, and why?",
    "What are two details the document gives?", "Who would find this document useful, and why?",
)  # fmt: skip


def answer_doc_prompts(data: Path, tok, n: int, seed: int, min_tokens: int = 60) -> list[str]:
    """Up to `n` document tasks (DOC_FORMS) over the target's own answers cached in DATA (those
    of at least `min_tokens` tokens, their end id dropped): prose written the way it writes."""
    import random

    if not shards(data) or n <= 0:
        return []
    d = load_shards(data, features=False)
    docs = []
    for s in range(len(d["prompt_lens"])):
        a, p, e = int(d["starts"][s]), int(d["prompt_lens"][s]), int(d["starts"][s + 1])
        if e - a - p >= min_tokens:
            docs.append(tok.decode(d["ids"][a + p : e - 1].tolist()).strip())
    rng = random.Random(seed)
    rng.shuffle(docs)
    return [rng.choice(DOC_FORMS).format(doc=doc, q=rng.choice(DOC_QUESTIONS)) for doc in docs[:n]]


def read_plan(data: Path) -> list[dict] | None:
    """DATA/plan.jsonl: every prompt the data phase answers, in order ({"kind", "prompt"})."""
    f = data / "plan.jsonl"
    if not f.is_file():
        return None
    return [json.loads(x) for x in f.read_text().splitlines() if x.strip()]


def write_plan(data: Path, plan: list[dict]) -> None:
    data.mkdir(parents=True, exist_ok=True)
    tmp = data / "plan.jsonl.tmp"
    tmp.write_text("".join(json.dumps(r) + "\n" for r in plan))
    tmp.replace(data / "plan.jsonl")


def _hf_model(tdir: Path, threads: int):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    return AutoModelForCausalLM.from_pretrained(str(tdir), dtype=torch.float32).eval()


@torch.inference_mode()
def _generate(
    model,
    rows: list[list[int]],
    max_new: int,
    pad: int,
    eos: set[int],
    greedy: bool,
    layers,
    topk: int,
):
    """Answer prompt `rows` (batched, left-padded) and read the teacher's features off the same
    passes: per row (ids, taps, top_ids, top_lp) over prompt + answer but its last token
    (whose forward never runs); the answer ends at its first eos, inclusive."""
    T = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (T - len(r)) + r for r in rows])
    att = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows])
    kw = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_p": 1.0}
    out = model.generate(
        input_ids=ids,
        attention_mask=att,
        max_new_tokens=max_new,
        pad_token_id=pad,
        eos_token_id=sorted(eos),
        output_hidden_states=True,
        return_dict_in_generate=True,
        **kw,
    )
    hs = out.hidden_states  # per step: [embeddings, layer 0 out, ..., normed last]

    def layer(i: int) -> torch.Tensor:  # (B, T + steps - 1, H)
        return torch.cat([step[i] for step in hs], dim=1)

    taps = torch.cat([layer(i + 1) for i in layers], dim=-1)
    last = layer(len(hs[0]) - 1)
    cap = getattr(model.config, "final_logit_softcapping", None)
    res = []
    for b, (r, row) in enumerate(zip(rows, out.sequences[:, T:].tolist(), strict=True)):
        cut = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
        seq = r + row[:cut]
        keep, a = len(seq) - 1, T - len(r)
        logits = model.lm_head(last[b, a : a + keep]).float()
        if cap:
            logits = torch.tanh(logits / cap) * cap
        lp, ti = torch.log_softmax(logits, -1).topk(topk, dim=-1)
        res.append((seq[:keep], taps[b, a : a + keep].half(), ti.int(), lp.half()))
    return res


def end_ids(tdir: Path) -> tuple[set[int], int]:
    """(the ids that end an answer, the padding id) as `generate` reads them: the generation
    config's, else the model config's, else 0."""
    from runtime.config import ModelConfig

    gen_cfg = (
        json.loads((tdir / "generation_config.json").read_text())
        if (tdir / "generation_config.json").is_file()
        else {}
    )
    eos = gen_cfg.get("eos_token_id", list(ModelConfig.from_dir(tdir).eos_token_ids) or [0])
    eos = set(eos if isinstance(eos, list) else [eos])
    pad = gen_cfg.get("pad_token_id")
    return eos, min(eos) if pad is None else pad


def renderer(tdir: Path):
    """prompt -> the ids the target answers: its chat template's one user turn, else the text."""
    from runtime.chat_template import ChatTemplate
    from runtime.tokenizer import Tokenizer

    tok, tmpl = Tokenizer(tdir), ChatTemplate.load(tdir)
    return lambda p: tmpl.render([{"role": "user", "content": p}]) if tmpl else tok.encode(p)


def by_length(prompts: list[str], render, block: int) -> list[str]:
    """`prompts` shortest first within blocks of `block` (less padding in a batch, the same mix
    of kinds across blocks)."""
    out = []
    for k in range(0, len(prompts), block):
        out += sorted(prompts[k : k + block], key=lambda p: len(render(p)))
    return out


def build_data(
    tdir: Path,
    prompts: list[str],
    data: Path,
    *,
    batch: int,
    max_new: int,
    topk: int,
    threads: int,
    deadline: float | None,
    sample_frac: float = 0.0,
    max_prompt: int = 256,
    progress=None,
) -> dict:
    """Answer and featurize `prompts`, in their order (`by_length` sorts them), from where DATA
    stopped until done or `deadline` (time.monotonic()). Prompts longer than `max_prompt`
    tokens are skipped.
    Returns {"prompts": done, "answer_tokens": n, "shards": n}."""
    from runtime.config import ModelConfig

    data.mkdir(parents=True, exist_ok=True)
    cfg = ModelConfig.from_dir(tdir)
    layers = tap_layers(cfg.num_layers)
    render = renderer(tdir)

    eos, pad = end_ids(tdir)
    model = _hf_model(tdir, threads)
    rendered = [render(p) for p in prompts]
    start = done_prompts(data)
    i, n_shard = start, len(shards(data))
    while i < len(prompts) and (deadline is None or time.monotonic() < deadline):
        chunk = rendered[i : i + batch]
        rows = [r for r in chunk if len(r) <= max_prompt] or [chunk[0][:max_prompt]]
        rng = torch.Generator().manual_seed(i)
        greedy = torch.rand((), generator=rng).item() >= sample_frac
        feats = _generate(model, rows, max_new, pad, eos, greedy, layers, topk)
        lens = [len(f[0]) for f in feats]
        shard = {
            "ids": torch.tensor([t for f in feats for t in f[0]], dtype=torch.int32),
            "starts": torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()]),
            "prompt_lens": torch.tensor([len(r) for r in rows]),
            "taps": torch.cat([f[1] for f in feats]),
            "top_ids": torch.cat([f[2] for f in feats]),
            "top_lp": torch.cat([f[3] for f in feats]),
            "layers": torch.tensor(layers),
        }
        answers = [n - len(r) + 1 for n, r in zip(lens, rows, strict=True)]
        path = data / SHARD.format(n_shard)
        torch.save(shard, str(path) + ".tmp")
        Path(str(path) + ".tmp").replace(path)
        with (data / "shards.jsonl").open("a") as f:
            f.write(
                json.dumps(
                    {
                        "shard": path.name,
                        "n": len(chunk),
                        "greedy": greedy,
                        "answer_tokens": sum(answers),
                    }
                )
                + "\n"
            )
        i, n_shard = i + len(chunk), n_shard + 1
        if progress is not None:
            progress(len(chunk), sum(answers))
    return data_stats(data)


def data_stats(data: Path) -> dict:
    """{"prompts", "answer_tokens", "shards"} cached in DATA so far."""
    f = data / "shards.jsonl"
    meta = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []
    return {
        "prompts": sum(m["n"] for m in meta),
        "shards": len(meta),
        "answer_tokens": sum(m["answer_tokens"] for m in meta),
    }


def load_shards(data: Path, features: bool = True) -> dict:
    """Every shard of DATA concatenated: ids, starts, prompt_lens, taps, top_ids, top_lp (the
    last three only with `features`)."""
    parts = [torch.load(p, weights_only=True, mmap=not features) for p in shards(data)]
    if not parts:
        from runtime.errors import DuetError

        raise DuetError(f"{data}: no training data (shard_*.pt) yet")
    off, starts = 0, [torch.tensor([0])]
    for p in parts:
        starts.append(p["starts"][1:] + off)
        off += int(p["starts"][-1])
    out = {
        "ids": torch.cat([p["ids"] for p in parts]).long(),
        "starts": torch.cat(starts),
        "prompt_lens": torch.cat([p["prompt_lens"] for p in parts]),
        "layers": tuple(parts[0]["layers"].tolist()),
    }
    if not features:
        return out
    return {
        **out,
        "taps": torch.cat([p["taps"] for p in parts]),
        "top_ids": torch.cat([p["top_ids"] for p in parts]).long(),
        "top_lp": torch.cat([p["top_lp"] for p in parts]),
    }
