"""One loaded pair serving completions one at a time, over KV caches kept between requests.

The engine turns a validated request into prompt ids (the checkpoint's chat
template for chat requests when it has one, the messages' texts joined by
newlines otherwise), checks them against the context, and runs a `Job`: a plain
generator that yields the text each decoding step adds, honours `stop` strings
and `max_tokens`, and on exit, finished or closed early (a client that went
away), leaves the caches holding only the committed sequence. Like mlx_lm.server
it keeps that sequence, so a request sharing a prefix with the previous one
(a chat's next turn) prefills only what is new: when the new prompt's text starts with what the
kept ids decode to, those ids are reused and only the rest is tokenized (runtime/chat_splice.py),
so an answer sent back as text keeps its generated ids even where they would not re-tokenize
to themselves. Requests must not overlap: the HTTP layer (app.py) serialises them. Nothing
here knows about HTTP or threads.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Iterator

from apps.server.requests import APIError, GenRequest
from runtime.chat_session import common_prefix, strategy_kwargs
from runtime.chat_splice import MISMATCH, SPLICED, TextCodec, splice
from runtime.chat_template import ChatTemplate
from runtime.decoding import Sampling
from runtime.decoding.events import rewind
from runtime.loading import Pair
from runtime.session import GenerationSession, context_of
from runtime.stats import RunStats


class Engine:
    """A target (and draft) with one decoding method and the caches it keeps across requests."""

    def __init__(
        self, pair: Pair, *, method: str, model_id: str, gamma: int = 4, chooser=None, **options
    ):
        """`method` auto takes the `chooser` the command layer built (runtime/cli_args_auto.py);
        `options`: the methods' options (kappa, exit_layer, ...), as a GenerationSession's."""
        if pair.tokenizer is None:
            from runtime.errors import DuetError

            raise DuetError(f"{pair.target_dir}: no tokenizer.json; the server needs a tokenizer")
        self.pair, self.method, self.model_id, self.gamma = pair, method, model_id, gamma
        self.options = strategy_kwargs(**options)
        self.tok = pair.tokenizer
        self.template = ChatTemplate.load(pair.target_dir)
        self.context = context_of(pair)
        self.vocab = pair.target.config.vocab_size
        self.eos = tuple(pair.target.config.eos_token_ids)
        self.session = GenerationSession(
            pair,
            method=method,
            options={**self.options, "gamma": gamma},
            chooser=chooser,
            eos=self.eos,
        )
        self.tcache = pair.target.new_cache()
        self.dcache = pair.draft.new_cache() if pair.draft is not None else None
        self.tokens: list[int] = []  # the sequence the caches hold a prefix of
        self.said_mismatch = False  # a template that cannot be spliced is told once

    def prompt_text(self, req: GenRequest):
        """(the request's prompt as text, what tokenizes it), or (None, None) for token ids."""
        if req.messages is not None:
            if self.template is not None:
                return self.template.render_text(req.messages), self.template
            return "\n".join(m["content"] for m in req.messages), TextCodec(self.tok)
        if isinstance(req.prompt, str):
            return req.prompt, TextCodec(self.tok)
        return None, None

    def prompt_ids(self, req: GenRequest) -> list[int]:
        """The request's prompt as token ids; a 400 when it is empty, out of vocabulary or too
        long."""
        if req.messages is not None:
            if self.template is not None:
                ids = self.template.render(req.messages)
            else:  # plain completion, as runtime.chat does without a template
                ids = self.tok.encode("\n".join(m["content"] for m in req.messages))
            param = "messages"
        elif isinstance(req.prompt, str):
            ids, param = self.tok.encode(req.prompt), "prompt"
        else:
            ids, param = list(req.prompt), "prompt"
            out = [t for t in ids if not 0 <= t < self.vocab]
            if out:
                raise APIError(
                    400,
                    f"token {out[0]} is outside the vocabulary [0, {self.vocab})",
                    param="prompt",
                    code="invalid_value",
                )
        if not ids:
            raise APIError(400, "the prompt is empty once tokenized", param=param)
        if len(ids) >= self.context:
            raise APIError(
                400,
                f"This model's maximum context length is {self.context} tokens, but the prompt "
                f"is {len(ids)} tokens; shorten it (the completion needs at least one more token).",
                param=param,
                code="context_length_exceeded",
            )
        return ids

    def warmup(self) -> None:
        """Generate one token from a one-token prompt, then empty the caches.

        Run at start-up: a method option the pair cannot take (an exit layer out of range)
        fails here, before the server listens, and the first request pays no warm-up.
        """
        list(self.job([0], GenRequest(prompt=[0], max_tokens=1, temperature=0.0)))
        self.tokens = []
        self.tcache = self.pair.target.new_cache()
        self.dcache = self.pair.draft.new_cache() if self.pair.draft is not None else None

    def job(self, ids: list[int], req: GenRequest) -> Job:
        """A generation of `req` after `ids`; iterate it (one step per item) or close it.

        `ids` are the prompt's own tokenization (`prompt_ids`); when the kept sequence's text
        starts the prompt's text, the job runs on those kept ids and the new text's tokens."""
        return Job(self, self.reuse(ids, req), req)

    def reuse(self, ids: list[int], req: GenRequest) -> list[int]:
        """`ids`, or the kept sequence spliced with the tokens of what the request adds."""
        text, codec = self.prompt_text(req)
        if text is None or not self.tokens:
            return ids
        sp = splice(self.tokens, text, codec, plain=ids)
        if sp.how == MISMATCH and not self.said_mismatch:
            self.said_mismatch = True
            print(
                "[server: this tokenizer cannot splice a conversation onto its generated ids; "
                "requests reuse the common prefix of their tokenization]",
                file=sys.stderr,
                flush=True,
            )
        return sp.ids if sp.how == SPLICED and len(sp.ids) < self.context else ids


class Job:
    """One completion: iterate for the text each step adds; then read `finish` and `usage()`."""

    def __init__(self, engine: Engine, ids: list[int], req: GenRequest):
        self.e, self.ids, self.req = engine, ids, req
        self.max_new = min(req.max_tokens or engine.context, engine.context - len(ids))
        self.out: list[int] = []
        self.text = ""  # the answer so far (EOS left out, cut at a stop string)
        self.sent = 0  # characters of `text` already yielded
        self.finish: str | None = None  # "stop" (EOS or a stop string), "length" or "cancelled"
        self.cached = 0  # prompt tokens the caches already held
        self.stats = RunStats(prefill_tokens=len(ids))
        self.seed = req.seed if req.seed is not None else random.randrange(2**31)
        self._gen = self._run()

    def __iter__(self) -> Iterator[str]:
        return self._gen

    def __next__(self) -> str:
        return next(self._gen)

    def close(self) -> None:
        """Stop generating; the caches keep only what was committed."""
        self._gen.close()

    def _run(self) -> Iterator[str]:
        e, req = self.e, self.req
        seq = self.ids
        self.cached = common_prefix(e.tokens, seq)
        if self.cached == len(seq):  # the last prompt token must still be fed for its logits
            self.cached -= 1
        for c in (e.tcache, e.dcache):
            rewind(c, self.cached)
        responses = e.session.stream(
            seq,
            self.max_new,
            seed=self.seed,
            sampling=Sampling(req.temperature, req.top_p),
            target_cache=e.tcache,
            draft_cache=e.dcache,
        )
        hold = max((len(s) for s in req.stop), default=1) - 1  # a stop string may be split
        eos = set(e.eos)
        try:
            for r in responses:
                toks = r.tokens
                self.out += toks
                self.stats = r.stats
                self.text += r.text  # the session holds back an incomplete UTF-8 character
                if self._cut_at_stop() or (toks and toks[-1] in eos):
                    self.finish = "stop"
                    break
                yield self._delta(len(self.text) - hold)
            if self.finish is None:
                self.finish = "length"
            self.text = self._final_text()
            yield self._delta(len(self.text))
        finally:
            if self.finish is None:  # closed early: the client went away
                self.finish = "cancelled"
            responses.close()  # the method rewinds its caches; auto learns from what ran
            e.tokens = seq + self.out
            for c in (e.tcache, e.dcache):  # a step may have seen tokens past a cut
                rewind(c, len(e.tokens))

    def _final_text(self) -> str:
        """All of the answer (bytes held back for UTF-8 included), cut at a stop string."""
        text = self.e.tok.decode([t for t in self.out if t not in set(self.e.eos)])
        if self.finish == "stop" and len(self.text) < len(text) and text.startswith(self.text):
            return self.text  # already cut at a stop string
        self.text = text
        self._cut_at_stop()
        return self.text

    def _cut_at_stop(self) -> bool:
        hits = [i for i in (self.text.find(s) for s in self.req.stop) if i >= 0]
        if hits:
            self.text = self.text[: min(hits)]
        return bool(hits)

    def _delta(self, upto: int) -> str:
        upto = max(self.sent, upto)
        d, self.sent = self.text[self.sent : upto], upto
        return d

    def usage(self) -> dict:
        """OpenAI's usage object, with the cached prompt tokens and a `speculative` summary."""
        s = self.stats.as_dict()
        n = len(self.out)
        return {
            "prompt_tokens": len(self.ids),
            "completion_tokens": n,
            "total_tokens": len(self.ids) + n,
            "prompt_tokens_details": {"cached_tokens": self.cached},
            "speculative": {
                "method": self.stats.extra.get("method", self.e.method),
                "steps": s["steps"],
                "mean_accepted": s["mean_accepted"],
                "acceptance_rate": s["acceptance_rate"],
                "tokens_per_s": s["tokens_per_s"],
            },
        }
