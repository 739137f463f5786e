"""The EAGLE head's data phase (`python -m apps.train eagle`, phase 1): which prompts the target
answers, in what order, and answering them into OUT/data/ (apps/train/eagle_data.py).

The plan is kept in DATA/plan.jsonl so a rerun with more prompts goes on where the last one
stopped; the answers and the teacher's features are appended shard by shard.
"""

from __future__ import annotations

from pathlib import Path

from runtime.errors import DuetError


def plan_prompts(a, tdir: Path, data: Path, deadline: float | None) -> list[str]:
    """The data phase's prompts in order, kept in DATA/plan.jsonl (apps/train/eagle_data.py):
    `--prompts` template prompts and `--self-prompts` the target writes itself, a quarter of
    those (once answers are cached) document tasks over its own answers. New prompts are
    shuffled in among those not yet answered, so a rerun with more of either goes on where the
    last one stopped; a cache from before plans existed keeps its template order."""
    import random

    from tqdm import tqdm

    from runtime.chat_template import ChatTemplate
    from runtime.tokenizer import Tokenizer

    from . import eagle_data as ed
    from .eagle_prompts import build_prompts, heldout_turns

    heldout_set = Path(__file__).resolve().parents[1] / "prompts" / "chat" / "chat.jsonl"
    templ = build_prompts(a.prompts, a.seed, heldout_set, a.doc_files)
    done, plan, block = ed.done_prompts(data), ed.read_plan(data), 8 * a.gen_batch
    render = ed.renderer(tdir)
    if plan is None:  # answered before plans were kept: build_prompts' order, sorted by blocks
        plan = [
            {"kind": "template", "prompt": p} for p in ed.by_length(templ, render, block)[:done]
        ]
    have = {r["prompt"] for r in plan}
    new = [{"kind": "template", "prompt": p} for p in templ if p not in have]
    want = a.self_prompts - sum(r["kind"] != "template" for r in plan)
    if want > 0:
        tmpl, tok = ChatTemplate.load(tdir), Tokenizer(tdir)
        if tmpl is None:
            raise DuetError(f"--self-prompts: {tdir} has no chat template to write prompts with")
        docs = ed.answer_doc_prompts(data, tok, want // 4, a.seed + len(plan)) if done else []
        eos, pad = ed.end_ids(tdir)
        bar = tqdm(total=want - len(docs), desc="self-prompts", unit="prompt", mininterval=10)
        mine = ed.self_prompts(
            ed._hf_model(tdir, a.threads),
            tok,
            tmpl,
            want - len(docs),
            seed=a.seed + len(plan),
            batch=a.gen_batch,
            eos=eos,
            pad=pad,
            banned=heldout_turns(heldout_set) | have,
            deadline=deadline,
            progress=bar.update,
        )
        bar.close()
        new += [{"kind": "self", "prompt": p} for p in mine]
        new += [{"kind": "answer-doc", "prompt": p} for p in docs]
    if new or not (data / "plan.jsonl").is_file():
        rest = plan[done:] + new
        random.Random(a.seed + done).shuffle(rest)
        order = {
            p: i for i, p in enumerate(ed.by_length([r["prompt"] for r in rest], render, block))
        }
        plan = plan[:done] + sorted(rest, key=lambda r: order[r["prompt"]])
        ed.write_plan(data, plan)
    return [r["prompt"] for r in plan]


def data_phase(a, tdir: Path, data: Path, deadline: float | None, skip: bool) -> dict:
    """Answer the planned prompts into DATA (phase 1) unless `skip`; the data's stats."""
    from .eagle_data import build_data, data_stats

    if skip:
        return data_stats(data)
    prompts = plan_prompts(a, tdir, data, deadline)
    print(f"data: answering up to {len(prompts)} prompts into {data}", flush=True)
    from tqdm import tqdm

    bar = tqdm(total=len(prompts), desc="data", unit="prompt", mininterval=10)
    stats = build_data(
        tdir,
        prompts,
        data,
        batch=a.gen_batch,
        max_new=a.max_new,
        topk=a.topk,
        threads=a.threads,
        max_prompt=a.max_prompt,
        deadline=deadline,
        progress=lambda n, _tk: bar.update(n),
    )
    bar.close()
    return stats
