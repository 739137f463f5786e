"""Duet's own methods as bench runners: any name in runtime.decoding.METHODS, and `auto`
(the latency model's pick per prompt; its probe is inside the timed turn)."""

from __future__ import annotations

import time

from runtime.chat_session import strategy_kwargs
from runtime.decoding import METHODS, Sampling, method_module
from runtime.session import GenerationSession
from runtime.stats import RunStats

from .turn import TurnResult


class DuetRunner:
    """`ar`, `sd`, ... through a GenerationSession (runtime/session.py), as runtime.generate
    runs them."""

    def __init__(self, method: str, pair, *, gamma: int, chooser=None, **extra):
        self.name = method
        self.method, self.pair, self.gamma = method, pair, gamma
        self.chooser = chooser  # method "auto": (ids, sampling) -> (method, record)
        self.picked: dict[str, int] = {}  # auto: how often each method was chosen
        self.extra = strategy_kwargs(**extra)  # --kappa / --exit-layer when the method takes them
        self.eos = tuple(pair.target.config.eos_token_ids)
        # summarize=False: a turn's time is its steps' (and auto's observe), as before the
        # session; the bench reads no method summary
        self.session = GenerationSession(
            pair,
            method=method,
            chooser=chooser,
            eos=self.eos,
            options={**self.extra, "gamma": gamma},
            summarize=False,
        )

    def settings(self) -> dict:
        s = self.pair.settings
        out = {"target": f"{s['target_backend']}"}
        if self.method != "ar":
            out["draft"] = s.get("draft_backend")
            if s.get("draft_threads") is not None:
                out["ort_intra_op_threads"] = s["draft_threads"]
                out["ort_provider"] = s.get("draft_provider")
            out["gamma"] = self.gamma
        if self.chooser is not None:
            out["auto_picked"] = dict(self.picked)
        if self.method in ("mirror", "auto"):  # where the draft worker ran (flag or default)
            from runtime.decoding.mirror import draft_in_process

            asked = self.extra.get("draft_process")
            out["draft_worker"] = (
                "process"
                if draft_in_process(self.pair.target, self.pair.draft, asked)
                else "thread"
            )
        if self.method in METHODS:  # only the options this method takes
            from dataclasses import fields

            known = {f.name for f in fields(method_module(self.method).Options)}
            return out | {k: v for k, v in self.extra.items() if k in known}
        return out | {k: v for k, v in self.extra.items()}

    def generate(self, ids, max_new, temp, top_p, seed) -> TurnResult:
        t0 = time.perf_counter()
        out: list[int] = []
        stats = RunStats(prefill_tokens=len(ids))
        for r in self.session.stream(list(ids), max_new, sampling=Sampling(temp, top_p), seed=seed):
            out += r.tokens
            stats = r.stats
        note = None
        rec = stats.extra.get("auto")
        if rec is not None:  # auto: its probe prefilled the caches the chosen method then used
            method, gamma = rec["choice"], stats.extra.get("gamma")
            pick = method if "by_gamma" not in rec else f"{method}@g{gamma}"
            self.picked[pick] = self.picked.get(pick, 0) + 1
            note = f"auto picked {pick}: {rec['why']}"
        return TurnResult(
            out,
            time.perf_counter() - t0,
            list(stats.accept_lengths),
            note=note,
            stage_s={"draft": stats.draft_s, "verify": stats.verify_s},
            verified_tokens=sum(stats.drafted) + len(stats.drafted),
            draft_passes=stats.per_step.get("draft_passes"),
        )
