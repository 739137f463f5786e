"""`--method auto` in the command layer: its flags, its options (AutoOptions, a plain
dataclass) and its chooser, the function runtime/session.py asks for a method (and γ) per
answer and tells what the run measured. The latency model lives in devices/; this file builds
it and hands it to the engine, which never imports upward (STYLE 11)."""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, fields

from runtime.cli_args_methods import DEFAULT_GAMMA, resolve_gamma
from runtime.loading import Pair
from runtime.session import AUTO  # noqa: F401 (the commands' name for it)


def add_auto_args(ap: argparse.ArgumentParser) -> None:
    """--device-profile: where `--method auto` takes its stage times from."""
    ap.add_argument(
        "--device-profile",
        metavar="PROFILE",
        help="auto: stage times from this device profile (a name or a file written by "
        "`python -m devices calibrate`) instead of measuring the pair at hand",
    )
    ap.add_argument(
        "--reprobe",
        action="store_true",
        help="auto: measure the pair again instead of reading what earlier runs on "
        "this machine measured (kept per pair and machine in $DUET_CACHE_DIR/auto, "
        "default ~/.cache/duet/auto; a week at most)",
    )


@dataclass(frozen=True)
class AutoOptions:
    """What `--method auto`'s chooser reads: plain values, from the flags (auto_options) or
    from a Python caller (runtime.api)."""

    gamma: int = DEFAULT_GAMMA  # γ when it is given; the one the stage times are measured at
    gamma_free: bool = False  # no --gamma: the latency model picks γ as well
    device_profile: str | None = None  # stage times from this profile, not measured
    reprobe: bool = False  # measure again instead of reading kept figures
    kappa: int | None = None  # mirror's flags, as the chosen run will take them
    exit_layer: int | None = None
    branches: int | None = None
    draft_branches: int | None = None
    draft_process: bool | None = None
    exit_head: str | None = None


def auto_options(a: argparse.Namespace) -> AutoOptions:
    """AutoOptions from a command's flags (those it lacks keep their defaults)."""
    resolve_gamma(a)
    names = {f.name for f in fields(AutoOptions)}
    return AutoOptions(**{k: v for k, v in vars(a).items() if k in names and v is not None})


def auto_chooser(a: AutoOptions, pair: Pair):
    """For `--method auto`: a function (prompt ids, sampling) -> (method, record), whose
    `observe(record, sampling, tokens, seconds)` reports what the chosen run measured.

    The latency model lives in devices/ (method_choice.py, pair_probe.py); the command layer
    builds it and hands it to the engine, which never imports upward (STYLE 11). The record
    (predictions per method, the inputs, the choice and why) goes into `stats.auto`.
    """
    if pair.draft is None or getattr(pair.draft, "model_free", False):
        return alone_chooser(pair, a)
    from devices.method_choice import AUTO_GAMMAS, Corrections
    from devices.pair_probe import choose_for, observe_branches, observe_run
    from devices.profile import load_profile

    profile = load_profile(a.device_profile) if a.device_profile else None
    corrections = Corrections()  # what this process's earlier auto runs measured
    store, keep = _kept_figures(pair, corrections, a.reprobe)

    def choose(ids: list[int], sampling, target_cache=None, draft_cache=None) -> tuple[str, dict]:
        """Given empty caches, a probe of the prompt prefills them with all of `ids`, or leaves
        them empty when it need not run (pass them on to make_steps either way); without, it
        reads only the last PROBE_TOKENS (a chat's long history)."""
        probe = list(ids) if target_cache is not None else list(ids)[-PROBE_TOKENS:]
        free = a.gamma_free  # no --gamma: the model picks γ as well
        greedy = sampling is None or sampling.greedy
        rec = choose_for(
            pair.target,
            pair.draft,
            probe,
            gamma=a.gamma,
            kappa=a.kappa,
            gammas=AUTO_GAMMAS if free else None,
            exit_layer=a.exit_layer,
            branches=a.branches,
            sampling=sampling,
            profile=profile,
            target_cache=target_cache,
            draft_cache=draft_cache,
            draft_process=a.draft_process,
            draft_branches=a.draft_branches,
            exit_head=a.exit_head,
            factors={m: corrections.factor(m, greedy) for m in ("ar", "sd", "mirror")},
        )
        for m, trial in rec.get("trials", {}).items():  # only the pair's first record has them
            corrections.seen.add(m)  # a trial leaves its first steps out: no warm-up skip
            corrections.observe(
                rec, m, trial["gamma"], greedy, trial["tokens_per_s"], trial.get("tokens_per_step")
            )
        rec = corrections.apply(rec, greedy)
        keep()
        return rec["choice"], rec

    def observe(
        rec: dict, sampling, tokens: int, seconds: float, accept_lengths=None, branch_hits=None
    ) -> None:
        """After the chosen run: its measured rate corrects later choices (Corrections), its
        accepted runs join the pair's τ(γ) estimate (pair_probe.observe_run), and a mirror
        run's branch hits (stats per_step "branch_hit") its Ω̂ (observe_branches). A run
        shorter than CORRECTION_MIN_TOKENS corrects nothing: its rate is mostly its prefill
        (a 16-token generate measured sd at 0.50x its law, and the kept factor then had auto
        run ar on the embedded pair, where sd is 1.6x ar)."""
        if accept_lengths and rec.get("choice") in ("sd", "mirror"):
            observe_run(pair.target, pair.draft, sampling, accept_lengths, rec.get("gamma"))
        if branch_hits and rec.get("choice") == "mirror" and "branch_shape" in rec:
            observe_branches(pair.target, pair.draft, sampling, branch_hits, **rec["branch_shape"])
        if seconds > 0 and tokens >= CORRECTION_MIN_TOKENS:
            per_step = tokens / len(accept_lengths) if accept_lengths else None
            corrections.observe(
                rec,
                rec["choice"],
                rec.get("gamma"),
                sampling is None or sampling.greedy,
                tokens / seconds,
                per_step,
            )
        elif tokens > 0:  # too short to correct anything, but it paid the method's warm-up
            corrections.seen.add(rec["choice"])
        keep()

    choose.observe, choose.store = observe, store
    return choose


def _kept_figures(pair: Pair, corrections, refresh: bool):
    """(the pair's ProbeStore or None, keep()): what earlier processes measured on this pair and
    machine (devices/probe_store.py) restored into the probe's memo and `corrections`; keep()
    saves them back."""
    from devices.probe_export import export_state, restore_state
    from devices.probe_store import ProbeStore

    store = ProbeStore.for_pair(pair.target, pair.draft, refresh=refresh)
    if store is not None:

        def restore(saved: dict) -> None:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(store.measured))
            note = f"{store.path} (measured {when})"
            restore_state(pair.target, pair.draft, saved.get("probe", []), note=note)
            corrections.load_state(saved.get("corrections", []))

        store.restore(restore)

    def keep() -> None:
        if store is not None:
            state = export_state(pair.target, pair.draft)
            store.save({"probe": state, "corrections": corrections.state()})

    return store, keep


ALONE_DRAFT = "suffix"  # the model-free draft auto runs sd with for a target alone


def own_draft(tdir) -> str | None:
    """The draft `--method auto` gives a target named without one, from what the target has:
    its fitted feature-level head (`python -m apps.train eagle`), else its multi-token-
    prediction head (in the checkpoint or its sidecar), which auto then weighs as any draft
    (ar, sd, mirror); None when it has neither (auto then runs it alone, or with the model-free
    draft: alone_chooser). (`head+suffix` drafts sd chains only, so auto is not given it.)
    Files are looked at, never loaded."""
    from runtime.drafts.head import WEIGHTS, head_sidecar
    from runtime.drafts.mtp.weights import has_mtp_weights

    if tdir is None:
        return None
    if (head_sidecar(tdir) / WEIGHTS).is_file():
        return "head"
    if has_mtp_weights(tdir):
        return "mtp"
    return None


def attach_alone_draft(pair: Pair) -> None:
    """Give a target alone the model-free draft `--method auto` may run sd with (no model)."""
    from runtime.drafts import load_model_free

    if pair.draft is None:
        pair.draft = load_model_free(ALONE_DRAFT, pair.target, pair.tokenizer)
        pair.settings["draft_backend"] = f"{ALONE_DRAFT} (model-free, for auto)"


def alone_chooser(pair: Pair | None = None, a: AutoOptions | None = None):
    """`--method auto` for a target alone (no --draft, or a model-free one): `ar`, or `sd` with
    the model-free draft (attached to `pair` here when it has none) where the latency law of
    devices/model_free_choice.py says it pays: it measures the target's cost per verified token
    and the draft's cost per step once per process, on the first prompt. Without a pair: `ar`."""
    if pair is not None:
        attach_alone_draft(pair)
    a = a if a is not None else AutoOptions(gamma_free=True)
    given = None if a.gamma_free else a.gamma
    made: dict = {}
    rates: dict = {}  # (sampling regime, method) -> tok/s of the runs auto observed
    # the target's costs, kept per target and machine as a pair's probe is (--reprobe: again)
    store = None
    if pair is not None:
        from devices.probe_store import ProbeStore

        store = ProbeStore.for_target(pair.target, "alone", refresh=a.reprobe)

    def choose(ids: list[int], sampling, target_cache=None, draft_cache=None) -> tuple[str, dict]:
        if pair is None:
            return "ar", {
                "choice": "ar",
                "alone": True,
                "why": "a target alone: ar is the method that needs no draft",
            }
        if "rec" not in made:
            from devices.model_free_choice import choose_alone, target_costs

            kept = store.load() if store is not None else None
            costs = kept if kept and "verify_token_share" in kept else target_costs(pair.target)
            if store is not None and costs is not kept:
                store.save(costs)
            made["rec"] = choose_alone(
                pair.target, pair.draft, list(ids), gamma=given, costs=costs
            ) | {"kept": costs is kept}
        rec = dict(made["rec"])
        if rec["choice"] == "sd" and sampling is not None and not sampling.greedy:
            # The law's chances are the draft's greedy ones; sampling accepts a deterministic
            # token with the target's own probability of it, often much less (SmolLM2 at T = 1:
            # sd+suffix 0.62x ar). So under sampling the two are measured: sd first, then ar
            # once, then the faster of the two medians.
            sd, ar = rates.get((_regime(sampling), "sd")), rates.get((_regime(sampling), "ar"))
            if sd and not ar:
                rec |= {
                    "choice": "ar",
                    "why": f"a target alone, sampling: sd ran at "
                    f"{statistics.median(sd):.1f} tok/s; ar once to compare",
                }
            elif sd and ar and statistics.median(ar) > statistics.median(sd):
                rec |= {
                    "choice": "ar",
                    "why": f"a target alone, sampling: ar measured "
                    f"{statistics.median(ar):.1f} tok/s against sd's "
                    f"{statistics.median(sd):.1f} (the draft's chances are greedy ones)",
                }
        return rec["choice"], rec

    def observe(
        rec: dict, sampling, tokens: int, seconds: float, accept_lengths=None, branch_hits=None
    ) -> None:
        """Under sampling, each run's rate (runs of CORRECTION_MIN_TOKENS or more) for the
        comparison choose makes; a greedy choice rests on the law alone."""
        if sampling is None or sampling.greedy or seconds <= 0 or tokens < CORRECTION_MIN_TOKENS:
            return
        rates.setdefault((_regime(sampling), rec["choice"]), []).append(tokens / seconds)

    choose.observe, choose.store, choose.alone = observe, None, True
    return choose


def _regime(sampling) -> tuple:
    """What a sampling setting is keyed by in alone_chooser's measured rates."""
    return (sampling.temp, sampling.top_p, getattr(sampling, "top_k", None))


def auto_announcement(chooser, when: str) -> str:
    """The one stderr line a command prints before auto's first choice: whether it measures
    the pair now (`when`: "first", or "during the first answer") or reads kept figures."""
    store = chooser.store
    if getattr(chooser, "alone", False):
        return (
            "[auto: a target alone: ar, or sd with a model-free draft (prompt and answer "
            "lookup, no model) where it pays on this machine; --draft adds a draft model]"
        )
    if store is not None and store.restored:
        day = time.strftime("%Y-%m-%d", time.localtime(store.measured))
        return (
            f"[auto: using the measurements of this pair on this machine kept in {store.path}"
            f" (from {day}); --reprobe measures again]"
        )
    kept = f"; kept in {store.path} for later runs" if store is not None else ""
    return (
        f"[auto: measuring this pair on this machine {when} to pick the fastest method "
        f"(7-15 s on a 2-core CPU, once){kept}; --method sd skips it]"
    )


CORRECTION_MIN_TOKENS = (
    64  # a chosen run this long or longer corrects the laws (the trials' length)
)
PROBE_TOKENS = 128  # auto estimates acceptance on the prompt's last tokens (a chat's history)
