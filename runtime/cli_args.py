"""Command-line flags every command that loads a target/draft pair shares."""

from __future__ import annotations

import argparse
import statistics
import time

import converters  # noqa: F401 (registers the on-the-fly exports the engine asks for: STYLE 11)
from runtime.load import TARGET_BACKENDS, Pair, load_pair


def add_pair_args(ap: argparse.ArgumentParser) -> None:
    """--target, --adapter, --draft, their backends, the draft's threads and ONNX Runtime provider."""
    ap.add_argument("--target", help="target: HF/MLX directory or Hub id (default: embedded pair)")
    ap.add_argument("--adapter", default=None,
                    help="LoRA adapter dir (PEFT format) for the target, merged at load")  # fmt: skip
    ap.add_argument(
        "--draft",
        help="draft: HF directory, exported .onnx, Hub id, `mtp` (the target checkpoint's own "
        "multi-token-prediction head), `head` (the feature-level head `python -m apps.train "
        "eagle` fitted beside the target), a model-free draft for sd/tree: `lookup` (prompt "
        "lookup over n-grams of the prompt and answer), `suffix` (SuffixDecoding: suffix tries "
        "over them), `suffix:FILE` (and a corpus file), or a head with one of them beside it "
        "for sd: `head+suffix`, `head+lookup`, `mtp+suffix`, `mtp+lookup` (the text's chain "
        "when it predicts well, else the head's) (default: embedded pair)",
    )
    ap.add_argument("--target-backend", choices=TARGET_BACKENDS, default="auto",
                    help="runs the target: auto = mlx on macOS (Metal), torch elsewhere; onnx = "
                    "ONNX Runtime, exported once and cached beside the checkpoint (default auto)")  # fmt: skip
    ap.add_argument("--quantize", choices=["int4", "int8", "none"], default="int4",
                    help="ONNX target weights: int4/int8 = block-wise MatMulNBits (blocks of 32, "
                    "int8 activations), requantized from the checkpoint's float32 weights (a "
                    "checkpoint from a GGUF keeps its own 4-bit blocks, its finer ones at 8 bits); "
                    "none = float32; a hybrid runs float32 (default int4; only with "
                    "--target-backend onnx)")  # fmt: skip
    ap.add_argument("--target-device", choices=["cpu", "cuda"], default="cpu",
                    help="PyTorch target: cpu, or cuda (a GPU; the draft stays on the CPU) (default cpu)")  # fmt: skip
    ap.add_argument("--target-threads", type=int, default=None,
                    help="PyTorch target threads, or the ONNX target's intra-op threads (default: "
                    "the cores the draft leaves; every core for an ONNX target with no draft model)")  # fmt: skip
    ap.add_argument("--draft-backend", choices=["onnx", "mlx", "torch"], default=None,
                    help="runs the draft (default onnx; a directory is exported on the fly and cached)")  # fmt: skip
    ap.add_argument("--draft-threads", type=int, default=1,
                    help="ONNX Runtime intra-op threads for the draft (default 1)")  # fmt: skip
    ap.add_argument("--hybrid-rollback", choices=["replay", "redecode"], default="replay",
                    help="hybrid (Qwen3.5) linear-attention states after a rejection: replay "
                         "(no second pass: pick the state the verify pass kept, or replay the "
                         "kept recurrence steps), or redecode (llama.cpp: restore a checkpoint, "
                         "re-run the accepted tokens) (default replay)")  # fmt: skip
    ap.add_argument("--provider", default="cpu",
                    help="ONNX Runtime execution provider: cpu, coreml, cuda, tensorrt, qnn (default cpu)")  # fmt: skip
    ap.add_argument("--draft-process", action="store_const", const=True, default=None,
                    help="mirror: run the draft worker in its own process (shared-memory channel) "
                    "instead of a thread (default: a process when the target runs on CUDA or "
                    "--emulate a device, else a thread)")  # fmt: skip
    ap.add_argument("--draft-thread", action="store_const", const=False, dest="draft_process",
                    help="mirror: run the draft worker in a thread of the target's process, "
                    "also beside a CUDA target")  # fmt: skip


def add_wave_args(ap: argparse.ArgumentParser) -> None:
    """mirror's branch waves, --branches and --draft-branches (runtime/mirror/draft_worker.py;
    None: the draft kind's defaults, runtime.decoding.mirror.wave_shape), one help for every CLI."""
    from runtime.decoding.mirror import (
        DEFAULT_BRANCH_BATCH,
        DEFAULT_DRAFT_BRANCHES,
        SS_BRANCH_BATCH,
        SS_DRAFT_BRANCHES,
    )

    ap.add_argument(
        "--branches",
        type=int,
        default=None,
        help="mirror: branches rolled out per batched draft pass, most likely first "
        f"(default {DEFAULT_BRANCH_BATCH}; {SS_BRANCH_BATCH} for a speculative-streaming draft)",
    )
    ap.add_argument(
        "--draft-branches",
        type=int,
        default=None,
        help="mirror: the draft's own runner-up tokens per window position whose branches it "
        "rolls out before the early exit, while the target runs its prefix "
        f"(default {DEFAULT_DRAFT_BRANCHES}; {SS_DRAFT_BRANCHES} for a speculative-streaming "
        "draft; 0: off)",
    )


def load_pair_from_args(a: argparse.Namespace, *, need_draft: bool) -> Pair:
    """load_pair with the flags of add_pair_args."""
    from runtime.errors import DuetError

    if a.draft_threads < 1:
        raise DuetError(f"--draft-threads must be at least 1 (got {a.draft_threads})")
    if a.target_threads is not None and a.target_threads < 1:
        raise DuetError(f"--target-threads must be at least 1 (got {a.target_threads})")
    pair = load_pair(a.target, a.draft, need_draft=need_draft, target_backend=a.target_backend,
                     draft_backend=a.draft_backend, draft_threads=a.draft_threads, provider=a.provider,
                     target_threads=a.target_threads, target_device=a.target_device,
                     adapter=a.adapter, quantize=getattr(a, "quantize", "int4"),
                     hybrid_rollback=getattr(a, "hybrid_rollback", "replay"))  # fmt: skip
    if getattr(a, "method", None) == AUTO and a.target is not None and a.draft is None:
        attach_alone_draft(pair)  # auto may run sd on a target alone (alone_chooser)
    return pair


DEFAULT_GAMMA = 4  # draft tokens per step when --gamma is not given (auto: its own pick)


def add_gamma_arg(ap: argparse.ArgumentParser) -> None:
    """--gamma, whose absence `--method auto` reads as "choose γ too" (resolve_gamma)."""
    from devices.method_choice import AUTO_GAMMAS

    ap.add_argument("--gamma", type=int, default=None,
                    help=f"draft tokens per step (default {DEFAULT_GAMMA}; --method auto "
                    f"picks it among {','.join(map(str, AUTO_GAMMAS))} unless given)")  # fmt: skip


def resolve_gamma(a: argparse.Namespace) -> None:
    """a.gamma_free: no --gamma was given; a.gamma: the given value or DEFAULT_GAMMA.
    A command without --gamma (apps.bench --edge's per-temperature checks) is left alone."""
    if not hasattr(a, "gamma"):
        return
    if getattr(a, "gamma_free", None) is None:
        a.gamma_free = a.gamma is None
    if a.gamma is None:
        a.gamma = DEFAULT_GAMMA


def check_decoding_args(a: argparse.Namespace) -> None:
    """One clear error for an out-of-range --max-tokens, --temp, --top-p, --top-k or --gamma."""
    from runtime.errors import DuetError

    resolve_gamma(a)
    if a.max_tokens < 1:
        raise DuetError(f"--max-tokens must be at least 1 (got {a.max_tokens})")
    if a.temp < 0:
        raise DuetError(f"--temp must be >= 0 (got {a.temp})")
    if not 0 < getattr(a, "top_p", 1.0) <= 1:
        raise DuetError(f"--top-p must be in (0, 1] (got {a.top_p})")
    if getattr(a, "top_k", 0) < 0:
        raise DuetError(f"--top-k must be >= 0 (got {a.top_k})")
    method = getattr(a, "method", "mirror")
    if method != "ar" and getattr(a, "gamma", 1) < 1:
        raise DuetError(f"--gamma must be at least 1 for --method {method} (got {a.gamma})")


AUTO = "auto"  # a chooser, not a method: resolved to one of METHODS before make_steps


def add_auto_args(ap: argparse.ArgumentParser) -> None:
    """--device-profile: where `--method auto` takes its stage times from."""
    ap.add_argument("--device-profile", metavar="PROFILE",
                    help="auto: stage times from this device profile (a name or a file written by "
                    "`python -m devices calibrate`) instead of measuring the pair at hand")  # fmt: skip
    ap.add_argument("--reprobe", action="store_true",
                    help="auto: measure the pair again instead of reading what earlier runs on "
                    "this machine measured (kept per pair and machine in $DUET_CACHE_DIR/auto, "
                    "default ~/.cache/duet/auto; a week at most)")  # fmt: skip


def auto_chooser(a: argparse.Namespace, pair: Pair):
    """For `--method auto`: a function (prompt ids, sampling) -> (method, record), whose
    `observe(record, sampling, tokens, seconds)` reports what the chosen run measured.

    The latency model lives in devices/ (method_choice.py, pair_probe.py); the command layer
    builds it and hands it to the engine, which never imports upward (STYLE 11). The record
    (predictions per method, the inputs, the choice and why) goes into `stats.auto`.
    """
    if pair.draft is None or getattr(pair.draft, "model_free", False):
        return alone_chooser(pair, a)
    from devices.method_choice import AUTO_GAMMAS, Corrections
    from devices.pair_probe import (
        choose_for,
        export_state,
        observe_branches,
        observe_run,
        restore_state,
    )
    from devices.probe_store import ProbeStore
    from devices.profile import load_profile

    name = getattr(a, "device_profile", None)
    profile = load_profile(name) if name else None
    corrections = Corrections()  # what this process's earlier auto runs measured
    # what earlier processes measured on this pair and machine (devices/probe_store.py)
    store = ProbeStore.for_pair(pair.target, pair.draft, refresh=getattr(a, "reprobe", False))
    if store is not None:

        def restore(saved: dict) -> None:
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(store.measured))
            restore_state(pair.target, pair.draft, saved.get("probe", []),
                          note=f"{store.path} (measured {when})")  # fmt: skip
            corrections.load_state(saved.get("corrections", []))

        store.restore(restore)

    def keep() -> None:
        if store is not None:
            store.save({"probe": export_state(pair.target, pair.draft),
                        "corrections": corrections.state()})  # fmt: skip

    def choose(ids: list[int], sampling, target_cache=None, draft_cache=None) -> tuple[str, dict]:
        """Given empty caches, a probe of the prompt prefills them with all of `ids`, or leaves
        them empty when it need not run (pass them on to make_steps either way); without, it
        reads only the last PROBE_TOKENS (a chat's long history)."""
        probe = list(ids) if target_cache is not None else list(ids)[-PROBE_TOKENS:]
        free = getattr(a, "gamma_free", False)  # no --gamma: the model picks γ as well
        greedy = sampling is None or sampling.greedy
        rec = choose_for(pair.target, pair.draft, probe, gamma=a.gamma, kappa=a.kappa,
                         gammas=AUTO_GAMMAS if free else None,
                         exit_layer=a.exit_layer, branches=a.branches, sampling=sampling,
                         profile=profile, target_cache=target_cache, draft_cache=draft_cache,
                         draft_process=getattr(a, "draft_process", None),
                         draft_branches=getattr(a, "draft_branches", None),
                         exit_head=getattr(a, "exit_head", None),
                         factors={m: corrections.factor(m, greedy)
                                  for m in ("ar", "sd", "mirror")})  # fmt: skip
        for m, trial in rec.get("trials", {}).items():  # only the pair's first record has them
            corrections.seen.add(m)  # a trial leaves its first steps out: no warm-up skip
            corrections.observe(rec, m, trial["gamma"], greedy, trial["tokens_per_s"],
                                trial.get("tokens_per_step"))  # fmt: skip
        rec = corrections.apply(rec, greedy)
        keep()
        return rec["choice"], rec

    def observe(rec: dict, sampling, tokens: int, seconds: float, accept_lengths=None,
                branch_hits=None) -> None:  # fmt: skip
        """After the chosen run: its measured rate corrects later choices (Corrections), its
        accepted runs join the pair's τ(γ) estimate (pair_probe.observe_run), and a mirror
        run's branch hits (stats per_step "branch_hit") its Ω̂ (observe_branches). A run
        shorter than CORRECTION_MIN_TOKENS corrects nothing: its rate is mostly its prefill
        (a 16-token generate measured sd at 0.50x its law, and the kept factor then had auto
        run ar on the embedded pair, where sd is 1.6x ar)."""
        if accept_lengths and rec.get("choice") in ("sd", "mirror"):
            observe_run(pair.target, pair.draft, sampling, accept_lengths, rec.get("gamma"))
        if branch_hits and rec.get("choice") == "mirror" and "branch_shape" in rec:
            observe_branches(pair.target, pair.draft, sampling, branch_hits,
                             **rec["branch_shape"])  # fmt: skip
        if seconds > 0 and tokens >= CORRECTION_MIN_TOKENS:
            per_step = tokens / len(accept_lengths) if accept_lengths else None
            corrections.observe(rec, rec["choice"], rec.get("gamma"),
                                sampling is None or sampling.greedy, tokens / seconds,
                                per_step)  # fmt: skip
        elif tokens > 0:  # too short to correct anything, but it paid the method's warm-up
            corrections.seen.add(rec["choice"])
        keep()

    choose.observe, choose.store = observe, store
    return choose


ALONE_DRAFT = "suffix"  # the model-free draft auto runs sd with for a target alone


def attach_alone_draft(pair: Pair) -> None:
    """Give a target alone the model-free draft `--method auto` may run sd with (no model)."""
    from runtime.drafts import load_model_free

    if pair.draft is None:
        pair.draft = load_model_free(ALONE_DRAFT, pair.target, pair.tokenizer)
        pair.settings["draft_backend"] = f"{ALONE_DRAFT} (model-free, for auto)"


def alone_chooser(pair: Pair | None = None, a: argparse.Namespace | None = None):
    """`--method auto` for a target alone (no --draft, or a model-free one): `ar`, or `sd` with
    the model-free draft (attached to `pair` here when it has none) where the latency law of
    devices/model_free_choice.py says it pays: it measures the target's cost per verified token
    and the draft's cost per step once per process, on the first prompt. Without a pair: `ar`."""
    if pair is not None:
        attach_alone_draft(pair)
    given = None if a is None or getattr(a, "gamma_free", True) else a.gamma
    made: dict = {}
    rates: dict = {}  # (sampling regime, method) -> tok/s of the runs auto observed
    # the target's costs, kept per target and machine as a pair's probe is (--reprobe: again)
    store = None
    if pair is not None:
        from devices.probe_store import ProbeStore

        store = ProbeStore.for_target(pair.target, "alone",
                                      refresh=getattr(a, "reprobe", False))  # fmt: skip

    def choose(ids: list[int], sampling, target_cache=None, draft_cache=None) -> tuple[str, dict]:
        if pair is None:
            return "ar", {"choice": "ar", "alone": True,
                          "why": "a target alone: ar is the method that needs no draft"}  # fmt: skip
        if "rec" not in made:
            from devices.model_free_choice import choose_alone, target_costs

            kept = store.load() if store is not None else None
            costs = kept if kept and "verify_token_share" in kept else target_costs(pair.target)
            if store is not None and costs is not kept:
                store.save(costs)
            made["rec"] = choose_alone(pair.target, pair.draft, list(ids), gamma=given,
                                       costs=costs) | {"kept": costs is kept}  # fmt: skip
        rec = dict(made["rec"])
        if rec["choice"] == "sd" and sampling is not None and not sampling.greedy:
            # The law's chances are the draft's greedy ones; sampling accepts a deterministic
            # token with the target's own probability of it, often much less (SmolLM2 at T = 1:
            # sd+suffix 0.62x ar). So under sampling the two are measured: sd first, then ar
            # once, then the faster of the two medians.
            sd, ar = rates.get((_regime(sampling), "sd")), rates.get((_regime(sampling), "ar"))
            if sd and not ar:
                rec |= {"choice": "ar", "why": f"a target alone, sampling: sd ran at "
                        f"{statistics.median(sd):.1f} tok/s; ar once to compare"}  # fmt: skip
            elif sd and ar and statistics.median(ar) > statistics.median(sd):
                rec |= {"choice": "ar", "why": f"a target alone, sampling: ar measured "
                        f"{statistics.median(ar):.1f} tok/s against sd's "
                        f"{statistics.median(sd):.1f} (the draft's chances are greedy ones)"}  # fmt: skip
        return rec["choice"], rec

    def observe(rec: dict, sampling, tokens: int, seconds: float, accept_lengths=None,
                branch_hits=None) -> None:  # fmt: skip
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
        return (f"[auto: using the measurements of this pair on this machine kept in {store.path}"
                f" (from {day}); --reprobe measures again]")  # fmt: skip
    kept = f"; kept in {store.path} for later runs" if store is not None else ""
    return (f"[auto: measuring this pair on this machine {when} to pick the fastest method "
            f"(7-15 s on a 2-core CPU, once){kept}; --method sd skips it]")  # fmt: skip


CORRECTION_MIN_TOKENS = (
    64  # a chosen run this long or longer corrects the laws (the trials' length)
)
PROBE_TOKENS = 128  # auto estimates acceptance on the prompt's last tokens (a chat's history)
