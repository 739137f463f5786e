"""Duet's own methods as bench runners: any name in runtime.decoding.METHODS, and `auto`
(the latency model's pick per prompt; its probe is inside the timed turn)."""

from __future__ import annotations

import time

from runtime.chat_session import strategy_kwargs
from runtime.decoding import METHODS, Sampling, make_steps, method_module, stream
from runtime.stats import RunStats

from .runner import TurnResult


class DuetRunner:
    """`ar`, `sd`, ... through make_steps + stream, exactly as runtime.generate runs them."""

    def __init__(self, method: str, pair, *, gamma: int, chooser=None, **extra):
        self.name = method
        self.method, self.pair, self.gamma = method, pair, gamma
        self.chooser = chooser  # method "auto": (ids, sampling) -> (method, record)
        self.picked: dict[str, int] = {}  # auto: how often each method was chosen
        self.extra = strategy_kwargs(**extra)  # --kappa / --exit-layer when the method takes them
        self.eos = tuple(pair.target.config.eos_token_ids)

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
            out["draft_worker"] = "process" if draft_in_process(
                self.pair.target, self.pair.draft, asked) else "thread"  # fmt: skip
        if self.method in METHODS:  # only the options this method takes
            from dataclasses import fields

            known = {f.name for f in fields(method_module(self.method).Options)}
            return out | {k: v for k, v in self.extra.items() if k in known}
        return out | {k: v for k, v in self.extra.items()}

    def generate(self, ids, max_new, temp, top_p, seed) -> TurnResult:
        stats = RunStats(prefill_tokens=len(ids))
        out: list[int] = []
        t0 = time.perf_counter()
        method, note, caches, gamma = self.method, None, {}, self.gamma
        if self.chooser is not None:  # its probe prefills the caches the chosen method then uses
            caches = {"target_cache": self.pair.target.new_cache(),
                      "draft_cache": self.pair.draft.new_cache()}  # fmt: skip
            method, rec = self.chooser(ids, Sampling(temp, top_p), **caches)
            gamma = rec.get("gamma", gamma)  # a free auto picks γ too
            pick = method if "by_gamma" not in rec else f"{method}@g{gamma}"
            self.picked[pick] = self.picked.get(pick, 0) + 1
            note = f"auto picked {pick}: {rec['why']}"
        draft = self.pair.draft if method != "ar" else None
        if hasattr(self.pair.target, "record_hidden"):  # only an MTP draft reads them
            self.pair.target.record_hidden = getattr(draft, "reads_target_hidden", False)
        if hasattr(self.pair.target, "record_layers"):  # a fitted head reads several layers
            head = getattr(draft, "head_module", None)
            self.pair.target.record_layers = getattr(head, "layers_tapped", None)
        steps = make_steps(
            method,
            self.pair.target,
            draft,
            list(ids),
            max_new=max_new,
            sampling=Sampling(temp, top_p),
            seed=seed,
            gamma=gamma,
            **caches,
            **self.extra,
        )
        t_run = time.perf_counter()
        for toks, _ in stream(steps, max_new=max_new, eos_ids=self.eos, stats=stats):
            out += toks
        if self.chooser is not None and hasattr(self.chooser, "observe"):
            self.chooser.observe(rec, Sampling(temp, top_p), len(out), time.perf_counter() - t_run,
                                 accept_lengths=list(stats.accept_lengths),
                                 branch_hits=stats.per_step.get("branch_hit"))  # fmt: skip
        return TurnResult(out, time.perf_counter() - t0, list(stats.accept_lengths), note=note,
                          stage_s={"draft": stats.draft_s, "verify": stats.verify_s},
                          verified_tokens=sum(stats.drafted) + len(stats.drafted),
                          draft_passes=stats.per_step.get("draft_passes"))  # fmt: skip
