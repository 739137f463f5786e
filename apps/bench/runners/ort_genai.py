"""onnxruntime-genai as bench runners, on its own int4 build of the same checkpoint.

    python -m onnxruntime_genai.models.builder -m CKPT_DIR -o OUT -p int4 -e cpu

is run once into the cache ($DUET_CACHE_DIR/ort-genai/NAME-int4, else
$XDG_CACHE_HOME/duet/..., else ~/.cache/duet/...) and reused. `ort-genai:ar` is its plain greedy
(or sampled) loop; `ort-genai:ngram` is its own model-free speculative mode (0.18 on the CPU:
`GeneratorParams.set_speculative_options(ngram_size=3, max_draft_tokens=γ)`, an n-gram lookup
over the prompt and the answer verified by the target). Its intra-op threads are the bench's
thread count (a config overlay, the built folder is untouched). Tokens per step come from the
generator's own speculative stats (`tokens_emitted` over `target_forward_passes`, spread
evenly: the mean is exact).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from runtime import paths
from runtime.errors import DuetError

from .llamacpp import even_lengths
from .turn import TurnResult

NGRAM_SIZE = 3


def cache_root() -> Path:
    """Where the genai builds live: the cache's `ort-genai` folder (runtime/paths.py)."""
    return paths.cache_dir("ort-genai")


def build_command(ckpt: Path, out: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "onnxruntime_genai.models.builder",
        "-m",
        str(ckpt),
        "-o",
        str(out),
        "-p",
        "int4",
        "-e",
        "cpu",
        "-c",
        str(out.parent / "hf-cache"),
    ]


def built_model(ckpt: Path, name: str) -> Path:
    """The int4 genai build of checkpoint `ckpt`, built once into the cache (a progress line on
    stderr, the builder's own output in OUT/../NAME-int4.log)."""
    out = cache_root() / f"{name}-int4"
    if (out / "genai_config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = build_command(ckpt, out)
    log = out.parent / f"{name}-int4.log"
    print(
        f"[ort-genai: building its int4 model of {ckpt} once into {out} (a minute or two); "
        f"log {log}]",
        file=sys.stderr,
        flush=True,
    )
    with log.open("w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0 or not (out / "genai_config.json").is_file():
        raise DuetError(
            f"onnxruntime-genai's model builder failed (exit {r.returncode}); "
            f"see {log}: `{' '.join(cmd)}`"
        )
    return out


class GenaiRunner:
    """`ort-genai:ar` (ngram False) or `ort-genai:ngram`."""

    group = "ort-genai"

    def __init__(
        self, model_dir: Path, *, threads: int, ngram: bool, gamma: int, eos: tuple[int, ...]
    ):
        import onnxruntime_genai as og

        self.og, self.ngram, self.gamma, self.eos = og, ngram, gamma, eos
        self.name = f"{self.group}:{'ngram' if ngram else 'ar'}"
        self.own_ar = f"{self.group}:ar"
        self.model_dir, self.threads = model_dir, threads
        cfg = og.Config(str(model_dir))
        opts = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
        cfg.overlay(json.dumps({"model": {"decoder": {"session_options": opts}}}))
        self.model = og.Model(cfg)

    def settings(self) -> dict:
        return {
            "threads": self.threads,
            "model": str(self.model_dir),
            "weights": "int4 (its model builder, -p int4 -e cpu)",
            "speculative": {"ngram_size": NGRAM_SIZE, "max_draft_tokens": self.gamma}
            if self.ngram
            else None,
            "onnxruntime_genai": self.og.__version__,
        }

    def generate(self, ids, max_new, temp, top_p, seed) -> TurnResult:
        og = self.og
        p = og.GeneratorParams(self.model)
        search = dict(max_length=len(ids) + max_new, min_length=0)
        if temp > 0:
            search |= dict(do_sample=True, temperature=temp, top_p=top_p, top_k=0, random_seed=seed)
        else:
            search |= dict(do_sample=False)
        p.set_search_options(**search)
        if self.ngram:
            p.set_speculative_options(ngram_size=NGRAM_SIZE, max_draft_tokens=self.gamma)
        out: list[int] = []
        t0 = time.perf_counter()
        g = og.Generator(self.model, p)
        g.append_tokens(list(ids))
        while not g.is_done() and len(out) < max_new:
            g.generate_next_token()
            out.append(int(g.get_next_tokens()[0]))
        wall = time.perf_counter() - t0
        if not self.ngram:
            return TurnResult(out, wall, [1] * len(out))
        st = g.get_speculative_stats()
        passes = int(st.get("target_forward_passes") or 0) + int(
            st.get("standard_fallback_steps") or 0
        )
        return TurnResult(out, wall, even_lengths(len(out), passes or len(out)))
