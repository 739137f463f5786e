"""A chat's turns over one pair of KV caches that live as long as the conversation.

The session owns the history (messages and the token sequence the caches
hold), renders each new turn (the tokenizer's chat template when it has one,
plain completion otherwise), trims the oldest turns when the history would
outgrow the context, and drives a decoding strategy over the *full* history:
the strategies only process the tokens the caches have not seen, so a second
turn's prefill is just its new tokens. With a template, the earlier answers stay the ids that
were generated (a sampled answer need not re-tokenize to them): each turn splices only what the
template adds (runtime/chat_splice.py), and says once when the template cannot be spliced. It
knows nothing about the terminal.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace

from runtime.chat_splice import MISMATCH, Splice, splice
from runtime.chat_template import ChatTemplate  # noqa: F401 (where the session's template lives)
from runtime.decoding import Sampling, option_names
from runtime.decoding.events import GREEDY, common_prefix, rewind
from runtime.session import GenerationSession, context_of
from runtime.stats import RunStats


@dataclass
class Turn:
    user: str
    answer: str
    user_ids: list[int]  # plain completion: exactly what was fed, so the cache stays a prefix
    answer_ids: list[int]


def strategy_kwargs(**maybe) -> dict:
    """The method options (`kappa`, `exit_layer`, ...) that some method takes and were given."""
    names = option_names()
    return {k: v for k, v in maybe.items() if v is not None and k in names}


class ChatSession:
    """History + caches + one decoding method; `answer(text)` streams the reply's tokens."""

    def __init__(
        self,
        target,
        draft,
        tokenizer,
        *,
        method: str = "sd",
        gamma: int = 4,
        sampling: Sampling = GREEDY,
        max_tokens: int = 256,
        seed: int = 0,
        template: ChatTemplate | None = None,
        system: str | None = None,
        notify=lambda msg: None,
        chooser=None,
        eos: tuple[int, ...] | None = None,
        **strategy_extra,
    ):
        self.target, self.draft, self.tok = target, draft, tokenizer
        self.method, self.gamma, self.sampling = method, gamma, sampling
        self.max_tokens, self.seed = max_tokens, seed
        self.template, self.system, self.notify = template, system, notify
        self.extra = strategy_kwargs(**strategy_extra)
        # method "auto": chooser(prompt ids, sampling) -> (method, record), built by the command
        # layer (runtime.cli_args_auto.auto_chooser); asked once per answer
        self.chooser = chooser
        self.pair = SimpleNamespace(
            target=target, draft=draft, tokenizer=tokenizer, target_dir=None
        )  # what a GenerationSession reads of a pair
        self.context = context_of(self.pair)
        # the ids that end an answer: config.json's, and generation_config.json's (runtime.api)
        self.eos = tuple(eos) if eos is not None else tuple(target.config.eos_token_ids)
        self.session = GenerationSession(
            self.pair,
            method=method,
            options={"gamma": gamma, **self.extra},
            chooser=chooser,
            eos=self.eos,
        )
        self.last_stats: RunStats | None = None
        self.said: set[str] = set()  # what the session has told once
        self.splice: Splice | None = None  # how the last templated prompt was made
        self.reset()

    def reset(self) -> None:
        """Forget the conversation and start from empty caches."""
        self.turns: list[Turn] = []
        self.tokens: list[int] = []  # the sequence the caches hold a prefix of
        self.tcache = self.target.new_cache()
        self.dcache = self.draft.new_cache() if self.draft is not None else None
        self.n_answers = 0

    # ---- rendering -------------------------------------------------------

    def _messages(self, turns: list[Turn], user: str) -> list[dict]:
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        for t in turns:
            msgs += [
                {"role": "user", "content": t.user},
                {"role": "assistant", "content": t.answer},
            ]
        return msgs + [{"role": "user", "content": user}]

    def _plain_user_ids(self, turns: list[Turn], user: str) -> list[int]:
        # plain completion: the typed line continues the document, on a new line after an answer
        sep = "\n" if turns and not turns[-1].answer.endswith("\n") else ""
        return self.tok.encode(sep + user)

    def _render(self, turns: list[Turn], user: str, user_ids: list[int]) -> list[int]:
        if self.template is not None:
            text = self.template.render_text(self._messages(turns, user))
            self.splice = splice(self.tokens, text, self.template)
            return self.splice.ids
        return [t for tr in turns for t in tr.user_ids + tr.answer_ids] + user_ids

    def _fit(self, user: str) -> tuple[list[int], list[int]]:
        """(full prompt ids, this turn's user ids), dropping the oldest turns to fit the context."""
        user_ids = self._plain_user_ids(self.turns, user) if self.template is None else []
        room = self.context - min(self.max_tokens, max(1, self.context // 4))
        seq = self._render(self.turns, user, user_ids)
        dropped = 0
        while len(seq) > room and self.turns:
            self.turns.pop(0)
            dropped += 1
            if self.template is None:
                user_ids = self._plain_user_ids(self.turns, user)
            seq = self._render(self.turns, user, user_ids)
        if dropped:
            self.notify(
                f"[history too long for the {self.context}-token context: dropped the "
                f"{dropped} oldest turn{'s' * (dropped > 1)}]"
            )
        elif self.template is not None:
            self._say_splice()
        if len(seq) > room:  # the message alone is too long: keep its end
            self.notify(f"[message is {len(seq)} tokens; keeping its last {room}]")
            seq = seq[-room:]
            user_ids = user_ids[-room:]
        return seq, user_ids

    def _say_splice(self) -> None:
        """Once per session: the template could not keep every earlier turn's ids."""
        held, sp = self.tokens, self.splice
        whole = len(held) - (1 if held and held[-1] in self.eos else 0)
        if sp.how == MISMATCH:
            self._once(
                "[this chat template cannot be spliced onto the generated ids: each turn "
                "re-tokenizes the conversation and prefills from the first token that differs]"
            )
        elif sp.kept < whole:
            self._once(
                "[the chat template renders an earlier answer otherwise than its generated "
                f"tokens: the turn prefills from there ({whole - sp.kept} earlier tokens again)]"
            )

    def _once(self, msg: str) -> None:
        key = msg.split(":")[0]
        if key not in self.said:
            self.said.add(key)
            self.notify(msg)

    # ---- one answer ------------------------------------------------------

    def answer(self, user: str) -> Iterator[list[int]]:
        """Stream the reply to `user` as lists of committed token ids.

        Closing the generator early (Ctrl-C) keeps what was committed so far as
        the answer and leaves the caches holding only committed tokens.
        """
        seq, user_ids = self._fit(user)
        keep = common_prefix(self.tokens, seq)  # the caches' valid prefix for this prompt
        for c in (self.tcache, self.dcache):
            rewind(c, keep)
        max_new = max(1, min(self.max_tokens, self.context - len(seq)))
        responses = self.session.stream(
            seq,
            max_new,
            sampling=self.sampling,
            seed=self.seed + self.n_answers,
            target_cache=self.tcache,
            draft_cache=self.dcache,
        )
        out: list[int] = []
        stats = RunStats(prefill_tokens=len(seq) - self.tcache.offset)  # until a step reports
        self.n_answers += 1
        try:
            for r in responses:
                out += r.tokens
                stats = r.stats
                yield r.tokens
        finally:
            # the method rewinds its caches; its summary joins the stats (flexspec's --skip:
            # the audited risk); auto learns from what ran
            responses.close()
            self.tokens = seq + out
            for c in (self.tcache, self.dcache):  # the strategy may have seen tokens cut at EOS
                rewind(c, len(self.tokens))
            answer_ids = out[:-1] if out and out[-1] in self.eos else out
            self.turns.append(Turn(user, self.tok.decode(answer_ids), user_ids, out))
            stats.extra.setdefault("method", self.method)
            stats.extra["finish"] = (
                "eos" if out and out[-1] in self.eos else ("length" if out else "stopped")
            )
            self.last_stats = stats


def stats_line(method: str, stats: RunStats) -> str:
    """One line: tokens/s, mean accepted length, acceptance rate (and the new prefill)."""
    s = stats.as_dict()
    rate = f", acceptance {s['acceptance_rate']:.2f}" if s["acceptance_rate"] is not None else ""
    return (
        f"[{method}] {s['new_tokens']} tokens, {s['tokens_per_s']:.1f} tok/s, "
        f"mean accepted {s['mean_accepted']:.2f}{rate}, prefill {s['prompt_tokens']} new tokens"
    )
