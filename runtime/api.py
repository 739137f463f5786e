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

The run itself is runtime/session.py's GenerationSession, which every command drives too.
This file is the top of the runtime, beside the commands: `method="auto"` builds the latency
model's chooser through the command layer (runtime/cli_args_auto.py) unless the caller
passes one.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from runtime.decoding import Sampling
from runtime.errors import DuetError
from runtime.session import (  # noqa: F401 (part of the API: runtime/__init__.py)
    AUTO,
    GenerationResponse,
    GenerationSession,
    context_of,
    default_method,
)

DEFAULT_CHAT_TEMP, DEFAULT_CHAT_TOP_P = 0.7, 0.9  # when generation_config.json says nothing


def load(target: str | None = None, draft: str | None = None, **options):
    """A loaded pair (`runtime.loading.Pair`): `target`, `draft`, `tokenizer`, `target_dir`.

    No arguments: the embedded default pair. `target` / `draft` are what `--target` /
    `--draft` take on the command line (a short name, a directory, a `.gguf` file, `mtp`);
    a target alone loads no draft (methods `ar`, or `auto`, which then runs it alone).
    `options` are load_pair's keywords (`target_backend`, `draft_backend`, `draft_threads`,
    `provider`, `target_threads`, `target_device`, `adapter`, `hybrid_rollback`,
    `quantize`, `need_draft`), and `reprobe`: with no `target_backend`, the target runs where
    the commands run it (runtime/placement.py: the machine's fastest at the model's own
    precision, measured once per model and machine and kept; `reprobe=True` measures again).
    """
    import converters  # noqa: F401 (the on-the-fly exports the engine asks for: STYLE 11)
    from runtime.loading import load_pair

    from runtime.cli_args import announce_target, target_chooser

    need = options.pop("need_draft", target is None or draft is not None)
    options.setdefault("target_chooser", target_chooser(options.pop("reprobe", False)))
    pair = load_pair(target, draft, need_draft=need, **options)
    announce_target(pair.settings)
    return pair


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
        raise DuetError(
            f"the prompt is {len(ids)} tokens but the model's context is {ctx}; shorten it"
        )
    return ids


def _tokenizer(pair):
    if pair.tokenizer is None:
        raise DuetError(f"{pair.target_dir}: no tokenizer.json; pass the prompt as token ids")
    return pair.tokenizer


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
    target_cache=None,
    draft_cache=None,
    **options,
) -> Iterator[GenerationResponse]:
    """Yield a GenerationResponse per decoding step of `method` on `pair` after `prompt`.

    `method`: ar, sd, mirror, tree, heterospec, flexspec or auto (default: sd with a draft,
    else ar). Every method is lossless: greedy (`temp=0`) gives the target's own tokens, and
    sampling the target's law. `gamma`: draft tokens per step (None: 4; auto picks it).
    `max_tokens` past the context is cut to what fits (`finish` is then "context").
    `options` are the methods' flags (kappa, exit_layer, branches, tree_k, ... as on the
    command line, in snake case); `target_cache` / `draft_cache` continue from caches holding
    a prefix of the prompt (a chat's history). `chooser` (method auto): the function
    runtime.cli_args_auto.auto_chooser builds; built here when not given. `timeline` (mirror):
    a runtime.mirror.timeline.Timeline that records the run. `eos`: the ids that end it
    (default eos_ids(pair)). Closing the generator early leaves the caches holding committed
    tokens. The run is runtime/session.py's GenerationSession.
    """
    ids = prompt_ids(pair, prompt)
    method = method or default_method(pair)
    if method == AUTO and chooser is None:
        from runtime.cli_args_auto import auto_chooser

        chooser = auto_chooser(_auto_options(gamma, options), pair)
    eos = eos if eos is not None else eos_ids(pair)
    session = GenerationSession(
        pair, method=method, options={"gamma": gamma, **options}, chooser=chooser, eos=eos
    )
    yield from session.stream(
        ids,
        max_tokens,
        sampling=Sampling(temp, top_p, top_k),
        seed=seed,
        target_cache=target_cache,
        draft_cache=draft_cache,
        timeline=timeline,
    )


def generate(pair, prompt, max_tokens: int = 128, **kwargs) -> str:
    """The text `stream_generate(pair, prompt, max_tokens, **kwargs)` produces, EOS left out."""
    return "".join(r.text for r in stream_generate(pair, prompt, max_tokens, **kwargs))


def _auto_options(gamma: int | None, options: dict):
    """AutoOptions for a Python caller: γ free when not given, the mirror flags it passed."""
    from runtime.cli_args_auto import AutoOptions
    from runtime.cli_args_methods import DEFAULT_GAMMA

    keep = ("kappa", "exit_layer", "branches", "draft_branches", "draft_process", "exit_head")
    return AutoOptions(
        gamma=gamma if gamma is not None else DEFAULT_GAMMA,
        gamma_free=gamma is None,
        **{k: options.get(k) for k in keep},
    )
