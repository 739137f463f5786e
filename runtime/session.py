"""One generation session: the only code that drives a decoding method.

    session = GenerationSession(pair, method="sd", options={"gamma": 4})
    for r in session.stream(ids, 64, sampling=Sampling(0.0), seed=0):
        print(r.text, end="", flush=True)

A session holds a pair, a method and the method's options (runtime/decoding/: each method's
`Options`), and the ids that end an answer. `stream` runs one answer: method `auto` asks the
chooser the command layer built (runtime/cli_args_auto.py) for the method and γ, its probe
prefilling fresh caches; the target records what the running draft reads of it; the method's
steps run through runtime.decoding's make_steps and stream; the method's own summary
(`summarize`) joins the stats; and auto learns from what ran. Caches passed in may hold a
prefix of the prompt (a chat's history, a server's previous request); whether the stream ends
or is closed early, they are left holding committed tokens only.

runtime.api's `stream_generate`, runtime.generate, runtime.chat, apps.server, apps.bench's
Duet runner and apps.profile all iterate a session.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from runtime.arg_rules import check_max_tokens
from runtime.decoding import Sampling, make_steps, method_module, method_options, stream
from runtime.decoding.events import GREEDY, StepEvent
from runtime.errors import DuetError
from runtime.stats import RunStats
from runtime.tokenizer import Detokenizer

AUTO = "auto"  # a chooser, not a method: resolved to one of runtime.decoding.METHODS per answer


@dataclass
class GenerationResponse:
    """One decoding step of a session's `stream`."""

    text: str  # the text this step adds (an incomplete UTF-8 character waits for the next)
    tokens: list[int]  # the token ids this step committed (an EOS included, as generated)
    step: StepEvent  # the step's own figures: accepted, drafted, draft_s, verify_s, extra
    stats: RunStats  # the run so far; `stats.as_dict()` is `runtime.generate --json`'s stats
    finish: str | None = None  # on the last step: "eos", "length" or "context"
    prompt_tokens: int = 0
    extra: dict = field(default_factory=dict)


def context_of(pair) -> int:
    """The tokens the pair can hold: the smaller of the target's and the draft's contexts."""
    ctxs = [pair.target.config.max_context]
    if pair.draft is not None:
        ctxs.append(pair.draft.config.max_context)
    return min(ctxs)


def default_method(pair) -> str:
    """sd when the pair has a draft, else the target alone (ar)."""
    return "sd" if pair.draft is not None else "ar"


def record_for(target, draft) -> None:
    """Have the target record what `draft` reads of it: its post-norm hidden states for an MTP
    head, the tapped layers for a fitted head (nothing for any other draft, or none)."""
    if hasattr(target, "record_hidden"):
        target.record_hidden = getattr(draft, "reads_target_hidden", False)
    if hasattr(target, "record_layers"):
        head = getattr(draft, "head_module", None)
        target.record_layers = getattr(head, "layers_tapped", None)


class GenerationSession:
    """A pair, a method (or auto with its chooser), its options and the ids that end an answer."""

    def __init__(
        self,
        pair,
        *,
        method: str | None = None,
        options: dict | None = None,
        chooser=None,
        eos: tuple[int, ...] | None = None,
        summarize: bool = True,
    ):
        """`options`: the methods' options (gamma, kappa, exit_layer, ... and flexspec's conn),
        each method taking those its Options names; gamma None: the method's default (auto:
        its pick). `chooser` (method auto): chooser(ids, sampling, target_cache=,
        draft_cache=) -> (method, record), with `observe` (runtime/cli_args_auto.py). `eos`:
        the ids that end an answer (default: the target's config.json's). `summarize`: add
        the method's summary of each run to its stats (a bench timing turns leaves it out)."""
        self.pair = pair
        self.method = method or default_method(pair)
        self.options = dict(options or {})
        if self.method == AUTO and chooser is None:
            raise DuetError("method auto needs a chooser (runtime.cli_args_auto.auto_chooser)")
        if self.method != AUTO:
            method_module(self.method).check(method_options(self.method, **self.options))
        self.chooser = chooser
        self.eos = tuple(eos) if eos is not None else tuple(pair.target.config.eos_token_ids)
        self.timeline = None  # the last stream's, when its method records one (mirror)
        self.summarize = summarize

    def stream(
        self,
        ids: list[int],
        max_tokens: int,
        *,
        sampling: Sampling = GREEDY,
        seed: int = 0,
        target_cache=None,
        draft_cache=None,
        timeline=None,
    ) -> Iterator[GenerationResponse]:
        """Yield a GenerationResponse per decoding step after the prompt `ids` (checked by the
        caller: runtime.api.prompt_ids). `max_tokens` past the context is cut to what fits
        (`finish` is then "context"). `timeline`: a runtime.mirror.timeline.Timeline the
        method records into when it records one (default: a new one, kept in `timeline`)."""
        check_max_tokens(max_tokens)
        pair, ids = self.pair, list(ids)
        max_new = min(max_tokens, context_of(pair) - len(ids))
        held = getattr(target_cache, "offset", 0)  # a prefix the caches hold
        caches = {"target_cache": target_cache, "draft_cache": draft_cache}
        method, gamma, auto = self.method, self.options.get("gamma"), None
        if method == AUTO:
            method, auto, caches = self._choose(ids, sampling, caches)
            gamma = auto.get("gamma", gamma)  # without a given γ, auto picks γ too
        draft = pair.draft if method != "ar" else None  # ar: the target alone, whatever is attached
        record_for(pair.target, draft)
        options = {**self.options, "gamma": gamma}
        mod = method_module(method)
        opts = method_options(method, **options)
        mod.check(opts)
        if getattr(mod, "RECORDS_TIMELINE", False):
            from runtime.mirror.timeline import Timeline

            timeline = timeline if timeline is not None else Timeline()
        else:
            timeline = None
        self.timeline = timeline
        steps = make_steps(
            method,
            pair.target,
            draft,
            ids,
            max_new=max_new,
            sampling=sampling,
            seed=seed,
            timeline=timeline,
            **caches,
            **options,
        )
        stats = RunStats(prefill_tokens=len(ids) - held)
        stats.extra.update(
            method=method, gamma=gamma if method != "ar" else None, temp=sampling.temp
        )
        if auto is not None:
            stats.extra["auto"] = auto
        run = _Run(self, ids, max_tokens, max_new, sampling, stats, auto, mod, opts)
        yield from run.drive(stream(steps, max_new=max_new, eos_ids=self.eos, stats=stats))

    def _choose(self, ids: list[int], sampling: Sampling, caches: dict):
        """auto's (method, record, caches): given no caches, the probe's passes are the prefill
        of fresh ones, which the chosen method then continues."""
        probe = {}
        if caches["target_cache"] is None:
            pair = self.pair
            draft_cache = pair.draft.new_cache() if pair.draft is not None else None
            caches = {"target_cache": pair.target.new_cache(), "draft_cache": draft_cache}
            probe = caches
        record_for(self.pair.target, self.pair.draft)  # the probe runs the pair's draft
        method, rec = self.chooser(ids, sampling, **probe)
        return method, rec, caches


class _Run:
    """One answer of a session: its tokens, text, finish, and what it reports at its end."""

    def __init__(self, session, ids, max_tokens, max_new, sampling, stats, auto, mod, opts):
        self.s, self.ids, self.max_tokens, self.max_new = session, ids, max_tokens, max_new
        self.sampling, self.stats, self.auto, self.mod, self.opts = sampling, stats, auto, mod, opts
        self.out: list[int] = []
        self.events: list[StepEvent] = []

    def drive(self, steps) -> Iterator[GenerationResponse]:
        """The responses of `steps` (runtime.decoding.stream's (tokens, event) pairs)."""
        s, stats, eos = self.s, self.stats, self.s.eos
        tok = getattr(s.pair, "tokenizer", None)
        detok = Detokenizer(tok) if tok is not None else None
        sent = 0  # characters of text yielded so far
        try:
            for toks, ev in steps:
                self.out += toks
                self.events.append(ev)
                text = detok.add([t for t in toks if t not in eos]) if detok is not None else ""
                finish = self._finish()
                if finish is not None:
                    stats.extra["finish"] = finish
                    if detok is not None:  # the last step flushes a character held back
                        text = tok.decode([t for t in self.out if t not in eos])[sent:]
                sent += len(text)
                yield GenerationResponse(text, list(toks), ev, stats, finish, len(self.ids))
        except GeneratorExit:  # the caller stopped early: what ran still counts
            steps.close()  # the method rewinds its caches
            self._end(observe=bool(self.out) and stats.wall_s > 0)
            raise
        ended = "length" if len(self.out) >= self.max_tokens else "context"
        stats.extra.setdefault("finish", ended)
        self._end(observe=True)

    def _finish(self) -> str | None:
        out = self.out
        if out and out[-1] in self.s.eos:
            return "eos"
        if len(out) >= self.max_new:
            return "length" if len(out) >= self.max_tokens else "context"
        return None

    def _end(self, observe: bool) -> None:
        """The method's summary into the stats; the run's rate, accepted lengths and branch
        hits teach auto."""
        s, stats = self.s, self.stats
        if s.summarize:
            stats.extra.update(
                self.mod.summarize(
                    self.events,
                    s.timeline,
                    options=self.opts,
                    pair=s.pair,
                    prompt=self.ids,
                    out=self.out,
                    sampling=self.sampling,
                )
            )
        chooser = s.chooser
        if observe and self.auto is not None and getattr(chooser, "observe", None) is not None:
            chooser.observe(
                self.auto,
                self.sampling,
                len(self.out),
                stats.wall_s,
                list(stats.accept_lengths),
                branch_hits=stats.per_step.get("branch_hit"),
            )
