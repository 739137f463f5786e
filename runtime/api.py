"""Duet from Python: `load`, `generate`, `stream_generate` (named after mlx-lm's).

    from runtime import load, generate, stream_generate

    pair = load()                                   # the embedded default pair
    print(generate(pair, "def fibonacci(n):", max_tokens=64))
    for r in stream_generate(pair, [{"role": "user", "content": "Hi"}], max_tokens=32, temp=0.7):
        print(r.text, end="", flush=True)

A prompt is a string, a list of token ids, or chat messages (`[{"role", "content"}]`,
rendered with the checkpoint's chat template; without one, the contents joined by newlines).
`stream_generate` yields one `GenerationResponse` per decoding step: the step's new text and
tokens, the step's event (accepted length, timings) and the run's statistics so far.

This is the one generation path: `runtime.generate` and `runtime.chat` call it too. It is
the top of the runtime, beside the commands: `method="auto"` builds the latency model's
chooser through the command layer (runtime/cli_args.py) unless the caller passes one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from runtime.decoding import Sampling, make_steps, stream
from runtime.decoding.events import StepEvent
from runtime.errors import DuetError
from runtime.stats import RunStats
from runtime.tokenizer import Detokenizer

DEFAULT_CHAT_TEMP, DEFAULT_CHAT_TOP_P = 0.7, 0.9  # when generation_config.json says nothing


def load(target: str | None = None, draft: str | None = None, **options):
    """A loaded pair (`runtime.load.Pair`): `target`, `draft`, `tokenizer`, `target_dir`.

    No arguments: the embedded default pair. `target` / `draft` are what `--target` /
    `--draft` take on the command line (a short name, a directory, a `.gguf` file, `mtp`);
    a target alone loads no draft (methods `ar`, or `auto`, which then runs it alone).
    `options` are load_pair's keywords (`target_backend`, `draft_backend`, `draft_threads`,
    `provider`, `target_threads`, `target_device`, `adapter`, `hybrid_rollback`,
    `need_draft`).
    """
    import converters  # noqa: F401 (the on-the-fly exports the engine asks for: STYLE 11)
    from runtime.load import load_pair

    need = options.pop("need_draft", target is None or draft is not None)
    return load_pair(target, draft, need_draft=need, **options)


@dataclass
class GenerationResponse:
    """One decoding step of `stream_generate`."""

    text: str  # the text this step adds (an incomplete UTF-8 character waits for the next)
    tokens: list[int]  # the token ids this step committed (an EOS included, as generated)
    step: StepEvent  # the step's own figures: accepted, drafted, draft_s, verify_s, extra
    stats: RunStats  # the run so far; `stats.as_dict()` is `runtime.generate --json`'s stats
    finish: str | None = None  # on the last step: "eos", "length" or "context"
    prompt_tokens: int = 0
    extra: dict = field(default_factory=dict)


def eos_ids(pair) -> tuple[int, ...]:
    """The target's end-of-sequence ids: config.json's and generation_config.json's."""
    ids = list(pair.target.config.eos_token_ids)
    gen = _generation_config(getattr(pair, "target_dir", None))
    eos = gen.get("eos_token_id")
    for i in eos if isinstance(eos, list) else ([] if eos is None else [eos]):
        if isinstance(i, int) and i not in ids:
            ids.append(i)
    return tuple(ids)


def sampling_defaults(model_dir) -> tuple[float, float]:
    """(temperature, top_p) a chat samples with by default: the checkpoint's
    generation_config.json when it sets both, else (0.7, 0.9)."""
    gen = _generation_config(model_dir)
    t, p = gen.get("temperature"), gen.get("top_p")
    if isinstance(t, int | float) and isinstance(p, int | float) and t >= 0 and 0 < p <= 1:
        return float(t), float(p)
    return DEFAULT_CHAT_TEMP, DEFAULT_CHAT_TOP_P


def _generation_config(model_dir) -> dict:
    f = Path(model_dir) / "generation_config.json" if model_dir is not None else None
    if f is None or not f.is_file():
        return {}
    try:
        data = json.loads(f.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise DuetError(f"{f}: not valid JSON") from None
    return data if isinstance(data, dict) else {}


def prompt_ids(pair, prompt) -> list[int]:
    """A prompt (text, token ids or chat messages) as token ids, checked against the target."""
    if isinstance(prompt, str):
        ids = _tokenizer(pair).encode(prompt)
    elif prompt and all(isinstance(m, dict) for m in prompt):
        from runtime.chat_template import ChatTemplate

        template = ChatTemplate.load(pair.target_dir)
        if template is not None:
            ids = template.render(list(prompt))
        else:  # no chat template: plain completion of the messages' texts
            ids = _tokenizer(pair).encode("\n".join(str(m.get("content", "")) for m in prompt))
    else:
        try:
            ids = [int(t) for t in prompt]
        except (TypeError, ValueError):
            raise DuetError("a prompt is a string, a list of token ids or chat messages") from None
    if not ids:
        raise DuetError("the prompt is empty")
    V = pair.target.config.vocab_size
    bad = [i for i in ids if not 0 <= i < V]
    if bad:
        raise DuetError(f"prompt token {bad[0]} is outside the vocabulary [0, {V})")
    ctx = context_of(pair)
    if len(ids) >= ctx:
        raise DuetError(f"the prompt is {len(ids)} tokens but the model's context is {ctx}; "
                        "shorten it")  # fmt: skip
    return ids


def _tokenizer(pair):
    if pair.tokenizer is None:
        raise DuetError(f"{pair.target_dir}: no tokenizer.json; pass the prompt as token ids")
    return pair.tokenizer


def default_method(pair) -> str:
    """sd when the pair has a draft, else the target alone (ar)."""
    return "sd" if pair.draft is not None else "ar"


def stream_generate(
    pair,
    prompt,
    max_tokens: int = 128,
    *,
    method: str | None = None,
    temp: float = 0.0,
    top_p: float = 1.0,
    top_k: int = 0,
    seed: int = 0,
    gamma: int | None = None,
    chooser=None,
    timeline=None,
    eos: tuple[int, ...] | None = None,
    **options,
) -> Iterator[GenerationResponse]:
    """Yield a GenerationResponse per decoding step of `method` on `pair` after `prompt`.

    `method`: ar, sd, mirror, tree, heterospec, flexspec or auto (default: sd with a draft,
    else ar). Every method is lossless: greedy (`temp=0`) gives the target's own tokens, and
    sampling the target's law. `gamma`: draft tokens per step (None: 4; auto picks it).
    `max_tokens` past the context is cut to what fits (`finish` is then "context").
    `options` are the methods' flags (kappa, exit_layer, branches, tree_k, ... as on the
    command line, in snake case), and `target_cache` / `draft_cache` to continue from caches
    holding a prefix of the prompt (a chat's history). `chooser` (method auto): the function
    runtime.cli_args.auto_chooser builds; built here when not given. `timeline` (mirror): a
    runtime.mirror.timeline.Timeline that records the run. `eos`: the ids that end it (default
    eos_ids(pair)). Closing the generator early leaves the caches holding committed tokens.
    """
    ids = prompt_ids(pair, prompt)
    method = method or default_method(pair)
    if max_tokens < 1:
        raise DuetError(f"max_tokens must be at least 1 (got {max_tokens})")
    max_new = min(max_tokens, context_of(pair) - len(ids))
    sampling = Sampling(temp, top_p, top_k)
    auto = None
    held = getattr(options.get("target_cache"), "offset", 0)  # a prefix the caches hold
    if method == "auto":
        if chooser is None:
            chooser = _auto_chooser(pair, gamma, options)
        probe_caches = {}
        if options.get("target_cache") is None:  # the probe's passes are the prefill: keep them
            options["target_cache"] = pair.target.new_cache()
            options["draft_cache"] = pair.draft.new_cache() if pair.draft is not None else None
            probe_caches = {k: options[k] for k in ("target_cache", "draft_cache")}
        method, auto = chooser(ids, sampling, **probe_caches)
        gamma = auto.get("gamma", gamma)  # without a given γ, auto picks γ too
    draft = pair.draft if method != "ar" else None  # ar is the target alone, whatever is attached
    steps = make_steps(method, pair.target, draft, ids, max_new=max_new, sampling=sampling,
                       seed=seed, gamma=gamma, timeline=timeline if method == "mirror" else None,
                       **options)  # fmt: skip
    stats = RunStats(prefill_tokens=len(ids) - held)
    stats.extra.update(method=method, gamma=gamma if method != "ar" else None, temp=temp)
    if auto is not None:
        stats.extra["auto"] = auto
    eos = tuple(eos) if eos is not None else eos_ids(pair)
    detok = Detokenizer(pair.tokenizer) if pair.tokenizer is not None else None
    out: list[int] = []
    sent = 0  # characters of text yielded so far

    def observe() -> None:  # the run's rate, accepted lengths and branch hits teach auto
        if auto is not None and getattr(chooser, "observe", None) is not None:
            chooser.observe(auto, sampling, len(out), stats.wall_s, list(stats.accept_lengths),
                            branch_hits=stats.per_step.get("branch_hit"))  # fmt: skip

    try:
        for toks, ev in stream(steps, max_new=max_new, eos_ids=eos, stats=stats):
            out += toks
            text = detok.add([t for t in toks if t not in eos]) if detok is not None else ""
            finish = None
            if out and out[-1] in eos:
                finish = "eos"
            elif len(out) >= max_new:
                finish = "length" if len(out) >= max_tokens else "context"
            if finish is not None:
                stats.extra["finish"] = finish
                if detok is not None:  # the last step flushes a character held back
                    text = _rest(pair.tokenizer, out, eos, sent)
            sent += len(text)
            yield GenerationResponse(text, list(toks), ev, stats, finish, len(ids))
    except GeneratorExit:  # the caller stopped early: what ran still counts
        if out and stats.wall_s > 0:
            observe()
        raise
    stats.extra.setdefault("finish", "length" if len(out) >= max_tokens else "context")
    observe()


def _rest(tokenizer, out: list[int], eos: tuple[int, ...], sent: int) -> str:
    """All of the answer's text past its first `sent` characters."""
    return tokenizer.decode([t for t in out if t not in eos])[sent:]


def context_of(pair) -> int:
    """The tokens the pair can hold: the smaller of the target's and the draft's contexts."""
    ctxs = [pair.target.config.max_context]
    if pair.draft is not None:
        ctxs.append(pair.draft.config.max_context)
    return min(ctxs)


def generate(pair, prompt, max_tokens: int = 128, **kwargs) -> str:
    """The text `stream_generate(pair, prompt, max_tokens, **kwargs)` produces, EOS left out."""
    return "".join(r.text for r in stream_generate(pair, prompt, max_tokens, **kwargs))


def _auto_chooser(pair, gamma: int | None, options: dict):
    """runtime.cli_args.auto_chooser for a Python caller: the same flags as the CLIs'."""
    from types import SimpleNamespace

    from runtime.cli_args import auto_chooser

    a = SimpleNamespace(gamma=gamma, gamma_free=gamma is None, device_profile=None,
                        reprobe=False, kappa=options.get("kappa"),
                        exit_layer=options.get("exit_layer"), branches=options.get("branches"),
                        draft_branches=options.get("draft_branches"),
                        draft_process=options.get("draft_process"),
                        exit_head=options.get("exit_head"))  # fmt: skip
    return auto_chooser(a, pair)
