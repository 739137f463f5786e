"""`python -m apps.bench footprint`: Duet's `ar` against Hugging Face `generate` on one target,
each in a fresh process (so each peak RSS is its own), alternating, at the same thread count.

    python -m apps.bench footprint --target smollm2-135m-instruct --rounds 3
    python -m apps.bench footprint --target gemma-3-270m --backends torch,mlx

Per round and runner: load time, tokens/s over the prompts' greedy answers (after one untimed
warm-up turn), peak RSS (the child's ru_maxrss), and whether its tokens equal the other
runners'. The table gives each runner's median and its ratio to HF's. Nothing is asserted:
this is the measurement behind issue 40's goals (tok/s >= HF's, peak RSS <= 1.1x HF's).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main

PROMPTS = [
    "Explain why the sky is blue in a few sentences.",
    "Write a Python function that checks whether a number is prime.",
    "Once upon a time, in a small village by the sea, there lived",
]


def build_parser() -> argparse.ArgumentParser:
    ap = doc_parser("python -m apps.bench footprint", __doc__)
    ap.add_argument("--target", required=True, help="a known short name, directory or .gguf")
    ap.add_argument(
        "--backends",
        default="torch",
        help="Duet target backends to run, comma-separated (torch, mlx; default torch)",
    )
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds (default 3)")
    ap.add_argument("--max-tokens", type=int, default=96, help="new tokens per prompt (default 96)")
    ap.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="threads for every runner (default: all cores)",
    )
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # internal: run one runner, print JSON
    ap.add_argument("--ids-file", help=argparse.SUPPRESS)  # internal: the prompts' token ids
    return ap


def _chat_ids(tok, text: str) -> list[int]:
    if getattr(tok, "chat_template", None):
        out = tok.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, return_dict=True
        )
        return list(out["input_ids"])
    return tok(text).input_ids


def worker(a: argparse.Namespace) -> dict:
    """Load the target one way, answer every prompt greedily; the figures as a dict. The prompts
    come tokenized (the parent's --ids-file); each runner holds what its user holds: the model
    and its tokenizer (Duet's load_pair loads its own, HF's user an AutoTokenizer)."""
    import torch

    from runtime.loading import resolve

    torch.set_num_threads(a.threads)
    d = resolve(a.target, "target")
    prompts = json.loads(open(a.ids_file).read())
    t0 = time.perf_counter()
    if a.worker == "hf":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(d))  # noqa: F841 (resident, as for any HF user)
        model = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()
        eos = model.generation_config.eos_token_id

        def answer(ids, n):
            with torch.inference_mode():
                y = model.generate(
                    torch.tensor([ids]),
                    max_new_tokens=n,
                    do_sample=False,
                    eos_token_id=eos,
                    pad_token_id=model.generation_config.pad_token_id or 0,
                )
            return y[0, len(ids) :].tolist()
    else:
        from runtime.decoding import Sampling
        from runtime.loading import load_pair
        from runtime.session import GenerationSession

        backend = a.worker.split(":")[1]
        pair = load_pair(
            a.target, None, need_draft=False, target_backend=backend, target_threads=a.threads
        )
        # the session's EOS: the target's config.json's; a timed turn is the whole stream
        session = GenerationSession(pair, method="ar", summarize=False)

        def answer(ids, n):
            turn = session.stream(list(ids), n, sampling=Sampling(), seed=0)
            return [t for r in turn for t in r.tokens]

    load_s = time.perf_counter() - t0
    answer(prompts[0], 8)  # warm-up, untimed
    tokens, t1 = [], time.perf_counter()
    for ids in prompts:
        tokens.append(answer(ids, a.max_tokens))
    wall = time.perf_counter() - t1
    n = sum(len(t) for t in tokens)
    return {
        "runner": a.worker,
        "load_s": load_s,
        "tokens_per_s": n / wall,
        "new_tokens": n,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "tokens": tokens,
    }


def run_child(a: argparse.Namespace, runner: str, ids_file: str) -> dict:
    cmd = [sys.executable, "-m", "apps.bench", "footprint", "--target", a.target, "--worker",
           runner, "--max-tokens", str(a.max_tokens), "--threads", str(a.threads),
           "--ids-file", ids_file]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise DuetError(f"footprint runner {runner} failed: {tail}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def footprint(a: argparse.Namespace) -> dict:
    runners = ["hf"] + [f"duet:{b.strip()}" for b in a.backends.split(",") if b.strip()]
    bad = [r for r in runners[1:] if r.split(":")[1] not in ("torch", "mlx")]
    if bad:
        raise DuetError(f"--backends: {', '.join(bad)}; choose from torch, mlx")
    if a.rounds < 1:
        raise DuetError(f"--rounds must be at least 1 (got {a.rounds})")
    from transformers import AutoTokenizer

    from runtime.loading import resolve

    tok = AutoTokenizer.from_pretrained(str(resolve(a.target, "target")))
    ids_file = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    with ids_file:
        json.dump([_chat_ids(tok, p) for p in PROMPTS], ids_file)
    runs: dict[str, list[dict]] = {r: [] for r in runners}
    for i in range(a.rounds):
        order = runners if i % 2 == 0 else runners[::-1]  # alternate who goes first
        for r in order:
            res = run_child(a, r, ids_file.name)
            runs[r].append(res)
            print(
                f"[round {i + 1}] {r}: {res['tokens_per_s']:.1f} tok/s, peak RSS "
                f"{res['peak_rss_mb']:.0f} MB, load {res['load_s']:.1f} s",
                file=sys.stderr,
            )
    ref = runs["hf"][0]["tokens"]
    hf_tps = statistics.median(x["tokens_per_s"] for x in runs["hf"])
    hf_rss = statistics.median(x["peak_rss_mb"] for x in runs["hf"])
    rows = []
    for r in runners:
        tps = statistics.median(x["tokens_per_s"] for x in runs[r])
        rss = statistics.median(x["peak_rss_mb"] for x in runs[r])
        rows.append(
            {
                "runner": r,
                "tokens_per_s": tps,
                "peak_rss_mb": rss,
                "load_s": statistics.median(x["load_s"] for x in runs[r]),
                "tok_s_vs_hf": tps / hf_tps,
                "rss_vs_hf": rss / hf_rss,
                "equals_hf": all(x["tokens"] == ref for x in runs[r]),
            }
        )
    return {
        "target": a.target,
        "threads": a.threads,
        "rounds": a.rounds,
        "max_tokens": a.max_tokens,
        "prompts": len(PROMPTS),
        "rows": rows,
    }


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.worker:
        print(json.dumps(worker(a)))
        return 0
    res = footprint(a)
    if a.json:
        print(json.dumps(res))
        return 0
    print(
        f"{res['target']}: {res['prompts']} chat prompts x {res['max_tokens']} tokens, greedy, "
        f"{res['threads']} threads, median of {res['rounds']} alternating rounds"
    )
    print(
        f"{'runner':<12} {'tok/s':>7} {'vs hf':>6} {'peak RSS':>9} {'vs hf':>6} {'load s':>7}  = hf"
    )
    for r in res["rows"]:
        print(
            f"{r['runner']:<12} {r['tokens_per_s']:7.1f} {r['tok_s_vs_hf']:5.2f}x "
            f"{r['peak_rss_mb']:7.0f} MB {r['rss_vs_hf']:5.2f}x {r['load_s']:7.1f}  "
            f"{'yes' if r['equals_hf'] else 'NO'}"
        )
    return 0
