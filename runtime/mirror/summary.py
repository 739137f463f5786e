"""Per-run Mirror-SD figures from the step events and the shared-clock timeline.

overlap_fraction  draft time hidden under the target's pass (its suffix, and its prefix for
                  the draft's own branches rolled out before the early exit) / draft time
t_rv_ee_us        early-exit message: send -> receive
t_rv_fv_us        final rendezvous: (A, c) sent -> next window in hand, less the draft's compute
                  (a fallback or resumed rollout); a completed branch is taken at once
t_rv_fv_by_source_us  the same, split: "taken" (reuse from the board), "waited" (the rest)
reuse_rate        steps whose next window was a completed branch
ff                App. E fallback frequency: (A, c) not a path of the hypothesis tree
resume_rate       steps whose branch was cut short by (A, c) and continued where it stopped
fallback_rate     steps that needed a fresh rollout (ff plus branches never started)
omega_kappa       mean top-κ mass overlap Ω_κ (eq. 9) at the correction position
step_ms_measured  mean step time; step_ms_predicted: eq. (10) from the measured stages
step_by_source    per next-window source (reuse, resume, fallback): share of steps, mean step
                  ms, and mean ms beyond the target's own prefix + suffix (what the draft cost)
draft_passes_per_window  J, the draft passes that made a window (App. C; SS drafts, §3.2)
"""

from __future__ import annotations

from runtime.decoding.events import StepEvent
from runtime.mirror.timeline import Timeline


def _overlap(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    """Total length of the intersection of two sets of intervals (each internally disjoint)."""
    total, i, j = 0, 0, 0
    a, b = sorted(a), sorted(b)
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def mirror_summary(events: list[StepEvent], timeline: Timeline) -> dict:
    """The figures above; steps without a following window (the last) count for timing only."""
    ivs = timeline.intervals
    suffix = [
        (i.start_ns, i.end_ns) for i in ivs if i.lane == "target" and i.name.startswith("suffix")
    ]
    prefix = [
        (i.start_ns, i.end_ns) for i in ivs if i.lane == "target" and i.name.startswith("prefix")
    ]
    branch = [
        (i.start_ns, i.end_ns) for i in ivs if i.lane == "draft" and i.name.startswith("rollout")
    ]
    fallback = [
        (i.start_ns, i.end_ns)
        for i in ivs
        if i.lane == "draft" and i.name.startswith(("fallback", "resume", "extend", "re-run"))
    ]
    draft_ns = sum(e - s for s, e in branch + fallback)
    hidden = _overlap(branch + fallback, prefix + suffix)
    ee = [i.dur_ns for i in ivs if i.lane == "channel" and i.name == "early-exit"]
    full = [e.extra for e in events if e.extra.get("draft")]
    n = len(full)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    rv_ee = mean(ee)
    rv_fv = mean([x["rv_fv_ns"] for x in full])
    passes = [p for e in events if (p := e.extra.get("per_step", {}).get("draft_passes"))]
    predicted = []
    for x in full:  # eq. (10): prefix + T_rv(ee) + max(suffix, T_draft^gen) + T_rv(fv)
        d = x["draft"]
        t_rv_fv = x["rv_fv_ns"] / 1e9
        if d["ee_recv_ns"] and d["ready_ns"] > d["ee_recv_ns"]:  # made after the early exit
            t_rv_ee = (d["ee_recv_ns"] - x["ee_sent_ns"]) / 1e9
            t_gen = (d["ready_ns"] - d["ee_recv_ns"]) / 1e9
        else:  # a draft's own branch, begun in the prefix: no early-exit rendezvous on its path,
            # and whatever of it ran past the early exit's send is its T_draft^gen
            t_rv_ee, t_gen = 0.0, max(d["ready_ns"] - x["ee_sent_ns"], 0) / 1e9
        if d.get("fv_recv_ns") and d["ready_ns"] > d["fv_recv_ns"]:  # made after the verdict:
            t_rv_fv -= (d["fv_recv_ns"] - x["fv_sent_ns"]) / 1e9  # T_draft^gen holds its leg
        predicted.append(x["prefix_s"] + t_rv_ee + max(x["suffix_s"], t_gen) + t_rv_fv)
    return {
        "steps": len(events),
        "overlap_fraction": hidden / draft_ns if draft_ns else None,
        "draft_busy_ms": draft_ns / 1e6,
        "t_rv_ee_us": rv_ee / 1e3 if rv_ee is not None else None,
        "t_rv_fv_us": rv_fv / 1e3 if rv_fv is not None else None,
        "t_rv_fv_by_source_us": {
            k: round(v / 1e3, 1)
            for k, v in (
                ("taken", mean([x["rv_fv_ns"] for x in full if x["taken"]])),
                ("waited", mean([x["rv_fv_ns"] for x in full if not x["taken"]])),
            )
            if v is not None
        },
        "reuse_rate": sum(x["reuse"] for x in full) / n if n else None,
        "resume_rate": sum(x["resume"] for x in full) / n if n else None,
        "fallback_rate": sum(x["fallback"] for x in full) / n if n else None,
        "ff": sum(not x["in_tree"] for x in full) / n if n else None,
        # the shares auto's law reads (method_choice.mirror_wait): (A, c) among the draft's
        # own runner-ups (Ω_own), or among own or early-exit candidates (Ω)
        "omega_own_measured": hit_share(full, ("own",)),
        "omega_measured": hit_share(full, ("own", "exit")),
        "omega_kappa": mean([x["omega_kappa"] for x in full]),
        "payload_bytes_per_step": mean([x["payload_bytes"] for x in full]),
        "step_ms_measured": 1e3 * mean([x["step_s"] for x in full]) if n else None,
        "step_ms_predicted": 1e3 * mean(predicted) if n else None,
        "step_by_source": {
            src: {
                "share": len(xs) / n,
                "step_ms": 1e3 * mean([x["step_s"] for x in xs]),
                "beyond_target_ms": 1e3
                * mean([x["step_s"] - x["prefix_s"] - x["suffix_s"] for x in xs]),
            }
            for src in ("reuse", "resume", "fallback")
            if (xs := [x for x in full if x[src]])
        },
        "prefix_ms": 1e3 * mean([x["prefix_s"] for x in full]) if n else None,
        "suffix_ms": 1e3 * mean([x["suffix_s"] for x in full]) if n else None,
        "draft_passes_per_window": mean(passes),  # J (App. C): γ for an AR draft, less for SS
    }


def hit_share(extras: list[dict], kinds: tuple[str, ...]) -> float | None:
    """The share of steps whose (A, c) was a branch of `kinds` (mirror's per-step branch_hit)."""
    hits = [h for x in extras if (h := x.get("per_step", {}).get("branch_hit")) is not None]
    return sum(h in kinds for h in hits) / len(hits) if hits else None
