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

Shard i (DATA/shard_00000.pt): ids (N,) int32 over its sequences laid end to end, starts (S+1,),
prompt_lens (S,), taps (N, n_taps * H) float16, top_ids (N, k) int32, top_lp (N, k) float16.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from runtime.backends.torch_eagle import tap_layers

SHARD = "shard_{:05d}.pt"


def shards(data: Path) -> list[Path]:
    return sorted(data.glob("shard_*.pt"))


def done_prompts(data: Path) -> int:
    """How many prompts the shards in DATA already hold (they are taken in order)."""
    meta = data / "shards.jsonl"
    if not meta.is_file():
        return 0
    return sum(json.loads(line)["n"] for line in meta.read_text().splitlines() if line.strip())


def _hf_model(tdir: Path, threads: int):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    return AutoModelForCausalLM.from_pretrained(str(tdir), dtype=torch.float32).eval()


@torch.inference_mode()
def _generate(model, rows: list[list[int]], max_new: int, pad: int, eos: set[int], greedy: bool,
              layers, topk: int):  # fmt: skip
    """Answer prompt `rows` (batched, left-padded) and read the teacher's features off the same
    passes: per row (ids, taps, top_ids, top_lp) over prompt + answer but its last token
    (whose forward never runs); the answer ends at its first eos, inclusive."""
    T = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (T - len(r)) + r for r in rows])
    att = torch.tensor([[0] * (T - len(r)) + [1] * len(r) for r in rows])
    kw = {"do_sample": False} if greedy else {"do_sample": True, "temperature": 1.0, "top_p": 1.0}
    out = model.generate(input_ids=ids, attention_mask=att, max_new_tokens=max_new,
                         pad_token_id=pad, eos_token_id=sorted(eos), output_hidden_states=True,
                         return_dict_in_generate=True, **kw)  # fmt: skip
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


def build_data(tdir: Path, prompts: list[str], data: Path, *, batch: int, max_new: int,
               topk: int, threads: int, deadline: float | None, sample_frac: float = 0.0,
               max_prompt: int = 256, progress=None) -> dict:  # fmt: skip
    """Answer and featurize `prompts` (from where DATA stopped) until done or `deadline`
    (time.monotonic()). Prompts longer than `max_prompt` tokens are skipped; within blocks of
    8 batches they are answered shortest first (less padding, the same mix of kinds).
    Returns {"prompts": done, "answer_tokens": n, "shards": n}."""
    from runtime.chat_template import ChatTemplate
    from runtime.config import ModelConfig
    from runtime.tokenizer import Tokenizer

    data.mkdir(parents=True, exist_ok=True)
    cfg = ModelConfig.from_dir(tdir)
    layers = tap_layers(cfg.num_layers)
    tok, tmpl = Tokenizer(tdir), ChatTemplate.load(tdir)

    def render(p: str) -> list[int]:
        return tmpl.render([{"role": "user", "content": p}]) if tmpl else tok.encode(p)

    gen_cfg = json.loads((tdir / "generation_config.json").read_text()) \
        if (tdir / "generation_config.json").is_file() else {}  # fmt: skip
    eos = gen_cfg.get("eos_token_id", list(cfg.eos_token_ids) or [0])
    eos = set(eos if isinstance(eos, list) else [eos])
    pad = gen_cfg.get("pad_token_id")
    pad = min(eos) if pad is None else pad
    model = _hf_model(tdir, threads)
    rendered, block = [], 8 * batch
    for k in range(0, len(prompts), block):
        rendered += sorted(map(render, prompts[k : k + block]), key=len)
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
            f.write(json.dumps({"shard": path.name, "n": len(chunk), "greedy": greedy,
                                "answer_tokens": sum(answers)}) + "\n")  # fmt: skip
        i, n_shard = i + len(chunk), n_shard + 1
        if progress is not None:
            progress(len(chunk), sum(answers))
    return data_stats(data)


def data_stats(data: Path) -> dict:
    """{"prompts", "answer_tokens", "shards"} cached in DATA so far."""
    f = data / "shards.jsonl"
    meta = [json.loads(x) for x in f.read_text().splitlines() if x.strip()] if f.is_file() else []
    return {"prompts": sum(m["n"] for m in meta), "shards": len(meta),
            "answer_tokens": sum(m["answer_tokens"] for m in meta)}  # fmt: skip


def load_shards(data: Path) -> dict:
    """Every shard of DATA concatenated: ids, starts, prompt_lens, taps, top_ids, top_lp."""
    parts = [torch.load(p, weights_only=True) for p in shards(data)]
    if not parts:
        from runtime.errors import DuetError

        raise DuetError(f"{data}: no training data (shard_*.pt) yet")
    off, starts = 0, [torch.tensor([0])]
    for p in parts:
        starts.append(p["starts"][1:] + off)
        off += int(p["starts"][-1])
    return {
        "ids": torch.cat([p["ids"] for p in parts]).long(),
        "starts": torch.cat(starts),
        "prompt_lens": torch.cat([p["prompt_lens"] for p in parts]),
        "taps": torch.cat([p["taps"] for p in parts]),
        "top_ids": torch.cat([p["top_ids"] for p in parts]).long(),
        "top_lp": torch.cat([p["top_lp"] for p in parts]),
        "layers": tuple(parts[0]["layers"].tolist()),
    }
