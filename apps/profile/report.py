"""The profile summary as text: the figures of DESIGN.md's Mirror-SD report, one per line."""

from __future__ import annotations


def summary_text(s: dict) -> str:
    """The profile summary for a reader, App. E's bound and eq. (10)'s error included."""
    lines = []
    add = lines.append
    f = lambda v, fmt=".3f": "n/a" if v is None else format(v, fmt)  # noqa: E731
    st, th = s["settings"], s["threads"]
    if s["emulated"]:
        add(f"EMULATED: {s['emulated']} (stage times padded to the profile, not measured on it)")
    add(
        f"mirror  γ={st['gamma']} κ={st['kappa']} ℓe={st['exit_layer']}/{st['num_layers']} "
        f"temp={st['temp']:g}  "
        f"{s['prompts']} prompts, {s['new_tokens']} tokens, {s['steps']} steps, "
        f"{f(s['tokens_per_s'], '.1f')} tok/s"
    )
    add(
        f"threads  ORT intra-op {th['ort_intra_op_threads']} ({th['draft_backend']} draft), "
        f"MLX {th['mlx_device']}, torch {th['torch_threads']}, {th['cpu_count']} CPUs"
    )
    add(
        f"overlap fraction     {f(s['overlap_fraction'])}  "
        "(draft time hidden under the target's pass)"
    )
    add(f"T_rv early-exit      {f(s['t_rv_ee_us'], '.1f')} µs")
    add(f"T_rv final + window  {f(s['t_rv_fv_us'], '.1f')} µs  {s.get('t_rv_fv_by_source_us', '')}")
    add(
        f"reuse rate           {f(s['reuse_rate'])}   resume rate {f(s['resume_rate'])}   "
        f"fallback rate {f(s['fallback_rate'])}"
    )
    if s.get("omega_measured") is not None:  # what auto's Ω̂ and Ω̂_own pool (pair_probe)
        add(
            f"branch hits          (A, c) an own runner-up {f(s['omega_own_measured'])}, "
            f"own or early exit {f(s['omega_measured'])} of steps"
        )
    b = s["bound_ff_le_1_minus_omega"]
    if b:
        add(
            f"App. E bound         FF {b['ff']:.3f} <= 1 - Ω_κ {b['one_minus_omega']:.3f}: "
            f"{'holds' if b['holds'] else 'VIOLATED'}"
        )
    add(
        f"step time            measured {f(s['step_ms_measured'])} ms, "
        f"eq. (10) {f(s['step_ms_predicted'])} ms, "
        f"error {f(None if s['eq10_rel_error'] is None else 100 * s['eq10_rel_error'], '.1f')} %"
    )
    add(f"  prefix 1..ℓe {f(s['prefix_ms'])} ms, suffix ℓe+1..N {f(s['suffix_ms'])} ms")
    by = s.get("step_by_source") or {}
    if by:
        add(
            "  by next window    "
            + ", ".join(
                f"{k} {v['share']:.3f} of steps: {v['step_ms']:.1f} ms "
                f"(+{v['beyond_target_ms']:.1f})"
                for k, v in by.items()
            )
        )
    if s.get("target_alone_ms") is not None:
        add(
            f"target slowdown      {f(s.get('target_slowdown'), '.2f')}x beside the draft "
            f"{st.get('draft_worker', 'thread')} "
            f"(alone {f(s['target_alone_ms'])} ms per window pass)"
        )
    return "\n".join(lines)
