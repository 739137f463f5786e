"""The ONNX Runtime backend for a hybrid Qwen3.5 draft: the one-token graph of
converters/onnx_hybrid_export.py, run once per token, with a StepStateCache.

A forward of T tokens is T session calls of the one-token graph, after each of which the
cache keeps the linear layers' states, so rolling the draft back to any accepted length picks
the states kept for it
(runtime/caches/step_state.py: exact, nothing re-run, γ + 1 states per linear layer and row
held per window). Masks: causal, or the key holes of branch rows forked with `fork_at` (each
row's attention skips exactly the columns its linear states did not take); a tree mask is
refused. A prompt (an unmasked forward of more than DEFAULT_PREFILL tokens) runs in chunks
through the prefill graph beside the file, when there is one: fewer calls, and no states kept
inside a chunk (rollback never lands in a prompt; if asked to, the cache starts over). Like the
plain ONNX backend it runs whole models only.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from runtime.backends.onnx.llama import empty_past
from runtime.caches.step_state import LINEAR, StepStateCache
from runtime.config import ModelConfig
from runtime.errors import DuetError
from runtime.model import check_tokens, default_positions

DEFAULT_PREFILL = 16  # tokens per call of the prefill graph


def prefill_path(path) -> Path:
    """The prefill graph beside the one-token graph `path`: `<stem>.prefill.onnx`."""
    path = Path(path)
    return path.with_name(path.stem + ".prefill.onnx")


def hybrid_io_names(cfg: ModelConfig) -> tuple[list[str], list[str]]:
    """(input names, output names) of the hybrid one-token graph, in graph order."""
    ins, outs = ["input_ids", "attention_mask", "position_ids"], ["logits"]
    for i, kind in enumerate(cfg.layer_types):
        if kind == LINEAR:
            ins += [f"past_conv.{i}", f"past_recurrent.{i}"]
            outs += [f"present_conv.{i}", f"present_recurrent.{i}"]
        else:
            ins += [f"past_key_values.{i}.key", f"past_key_values.{i}.value"]
            outs += [f"present.{i}.key", f"present.{i}.value"]
    return ins, outs


class OnnxHybridLM:
    """CausalLM over a hybrid one-token ONNX graph (states as inputs and outputs)."""

    backend = "onnx"
    supports_layer_range = False

    def __init__(
        self, session, config: ModelConfig, path, provider: str, threads: tuple, prefill=None
    ):
        """`prefill`: an optional session of the prefill graph (DEFAULT_PREFILL tokens a call)."""
        self.session, self.config, self.provider, self.threads = session, config, provider, threads
        self.prefill = prefill
        self._chunk = prefill.get_inputs()[0].shape[1] if prefill is not None else 0
        ins, self._outputs = hybrid_io_names(config)
        self._past_names = ins[3:]
        got = {i.name: i for i in session.get_inputs()}
        if [i.name for i in session.get_inputs()] != ins or got["input_ids"].shape[1] != 1:
            raise DuetError(
                f"{path}: not a Duet hybrid one-token export for this config (expected inputs "
                f"{ins[:5]}...); re-export it with `python -m converters export --format onnx`"
            )
        if prefill is not None and [i.name for i in prefill.get_inputs()] != ins:
            raise DuetError(f"{prefill_path(path)}: its inputs are not those of {path}; re-export")
        r = config.raw
        self._conv = (2 * int(r["linear_num_key_heads"]) * int(r["linear_key_head_dim"])
                      + int(r["linear_num_value_heads"]) * int(r["linear_value_head_dim"]),
                      int(r.get("linear_conv_kernel_dim", 4)) - 1)  # fmt: skip
        self._rec = (int(r["linear_num_value_heads"]), int(r["linear_key_head_dim"]),
                     int(r["linear_value_head_dim"]))  # fmt: skip
        self._dtype = np.float16 if "float16" in got["past_conv.0"].type else np.float32

    def new_cache(self, batch: int = 1) -> StepStateCache:
        c = self.config
        return StepStateCache(
            c.layer_types,
            batch,
            empty_past(c, self._dtype),
            lambda i, b: (
                np.zeros((b, *self._conv), self._dtype),
                np.zeros((b, *self._rec), np.float32),
            ),
        )

    def forward(self, tokens, cache: StepStateCache, *, positions=None, mask=None) -> np.ndarray:
        ids = check_tokens(tokens, self.config.vocab_size)
        B, T = ids.shape
        off = cache.offset
        pos = default_positions(off, B, T) if positions is None else np.asarray(positions)
        m = None if mask is None else np.broadcast_to(np.asarray(mask, bool), (B, T, off + T))
        out, start = [], 0
        while m is None and self.prefill is not None and T - start > self._chunk:
            # prompt chunks; the last token always runs alone, so the states after T-1 and T
            # are both kept (speculative rollback lands at most there)
            w = self._chunk
            out.append(
                self._call(
                    self.prefill,
                    cache,
                    ids[:, start : start + w],
                    np.ones((B, off + start + w), np.int64),
                    pos[:, start : start + w],
                )
            )
            start += w
        for t in range(start, T):  # one token a call: the states after each are kept
            keys = np.ones((B, off + t + 1), bool) if m is None else m[:, t, : off + t + 1]
            if m is not None and (m[:, t, off + t + 1 :].any() or not cache.holes_ok(keys)):
                raise DuetError(
                    "the hybrid ONNX draft takes causal masks, or the key holes of branch rows "
                    "forked at their own lengths (fork_at); a tree mask needs mlx or torch"
                )
            out.append(
                self._call(
                    self.session, cache, ids[:, t : t + 1], keys.astype(np.int64), pos[:, t : t + 1]
                )
            )
        return np.concatenate(out, axis=1).astype(np.float32, copy=False)

    def _call(self, session, cache: StepStateCache, ids, keys, pos) -> np.ndarray:
        """One session call over ids (B, n): feeds the cache's past, pushes the presents."""
        feed = {"input_ids": ids, "attention_mask": keys,
                "position_ids": np.ascontiguousarray(pos, np.int64)}  # fmt: skip
        past = zip(self._past_names, cache.past(), strict=True)
        feed.update({n: np.ascontiguousarray(a) for n, a in past})
        res = session.run(self._outputs, feed)
        cache.push(res[1:], ids.shape[1])
        return res[0]

    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        raise DuetError(
            "the ONNX backend runs whole models only; use --draft-backend torch for layer ranges"
        )

    def head(self, hidden):
        raise DuetError("the ONNX backend runs whole models only; it has no separate LM head")


def load(path, config: ModelConfig, **kw) -> OnnxHybridLM:
    """This family's entry in runtime/backends/onnx/__init__.py's FAMILIES: the one-token graph
    at `path`, and its prefill graph when one was exported beside it."""
    from runtime.backends.onnx.llama import open_session

    prov, intra, inter = (kw.get("provider", "cpu"), kw.get("intra_threads", 1),
                          kw.get("inter_threads", 1))  # fmt: skip
    pre = prefill_path(path)
    pre = open_session(pre, prov, intra, inter) if pre.is_file() else None
    return OnnxHybridLM(
        open_session(path, prov, intra, inter), config, path, prov, (intra, inter), pre
    )
