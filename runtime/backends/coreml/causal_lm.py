"""The Core ML backend: a draft `.mlpackage` from `converters` on the Neural Engine.

Prediction needs macOS 15 / iOS 18 (Core ML state); on any other OS `load`
refuses with one clear line. The package has two functions sharing weights:
`prefill` (a fixed query length P, the last chunk padded) and `decode` (one
token). The cache is either Core ML state (stateful packages) or host arrays
passed in and out (the kvio fallback); either way rollback is moving the
host's offset, because the additive mask hides slots at or past it and the
next call overwrites them. Whole-model forward only, batch 1.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from runtime.caches.slots import OneRowSlots
from runtime.config import ModelConfig
from runtime.errors import DuetError
from runtime.model import causal_mask, check_tokens, default_positions

COMPUTE_UNITS = {"all": "ALL", "ane": "CPU_AND_NE", "gpu": "CPU_AND_GPU", "cpu": "CPU_ONLY"}
NEG = -1e4  # additive mask value: exp(-1e4) is 0 in fp16 without the inf-inf NaN risk


class CoreMLCache(OneRowSlots):
    """A batch-1 cache of S slots: Core ML state or host (L, n_kv, S, D) fp16 arrays."""

    holder = "the Core ML backend"

    def __init__(self, state, shape: tuple[int, ...] | None):
        self.state = state  # MLState for stateful packages, else None
        self.k = np.zeros(shape, np.float16) if shape else None
        self.v = np.zeros(shape, np.float16) if shape else None
        self._offset = 0


class CoreMLCausalLM:
    """CausalLM over a Duet draft .mlpackage (macOS only)."""

    backend = "coreml"
    supports_layer_range = False

    def __init__(self, path: Path, config: ModelConfig, desc: dict, compute_units: str):
        import coremltools as ct

        units = getattr(ct.ComputeUnit, COMPUTE_UNITS[compute_units])
        self.config = config
        self.path = path
        self.compute_units = compute_units
        self.stateful = desc["report"].get("flavour", "stateful") == "stateful"
        dec = desc["functions"]["decode"]
        cache = dec["states"] if self.stateful else dec["inputs"]
        self.cache_shape = tuple(cache["k_cache"]["shape"])  # (L, n_kv, S, D)
        self.context = self.cache_shape[2]
        self.prefill_len = desc["functions"]["prefill"]["inputs"]["input_ids"]["shape"][1]
        self.fns = {
            name: ct.models.MLModel(str(path), compute_units=units, function_name=name)
            for name in ("prefill", "decode")
        }

    @classmethod
    def load(cls, path, compute_units: str = "all") -> CoreMLCausalLM:
        """Load a package written by `python -m converters export --format coreml`."""
        from runtime.backends.coreml.spec import check_structure, describe

        p = Path(path)
        if compute_units not in COMPUTE_UNITS:
            raise DuetError(
                f"unknown Core ML compute units {compute_units!r}; "
                f"choose from {', '.join(COMPUTE_UNITS)}"
            )
        desc = describe(p)
        problems = check_structure(desc)
        if problems or not desc["report"]:
            raise DuetError(
                f"{p}: not a Duet Core ML draft "
                f"({'; '.join(problems) or 'no duet.report metadata'})"
            )
        if sys.platform != "darwin":
            raise DuetError(
                f"{p}: Core ML prediction needs macOS 15 or later (this is {sys.platform}); "
                "run the .onnx draft with --draft-backend onnx instead"
            )
        config = ModelConfig.from_dict(desc["report"]["config"], where=f"{p} metadata")
        return cls(p, config, desc, compute_units)

    def new_cache(self, batch: int = 1) -> CoreMLCache:
        if batch != 1:
            raise DuetError(f"the Core ML backend runs batch 1 only (asked for {batch} rows)")
        if self.stateful:
            return CoreMLCache(self.fns["decode"].make_state(), None)
        return CoreMLCache(None, self.cache_shape)

    def forward(self, tokens, cache: CoreMLCache, *, positions=None, mask=None) -> np.ndarray:
        ids = check_tokens(tokens, self.config.vocab_size)
        if ids.shape[0] != 1:
            raise DuetError(f"the Core ML backend runs batch 1 only (got {ids.shape[0]} rows)")
        T, off = ids.shape[1], cache.offset
        if off + T > self.context:
            raise DuetError(
                f"{off + T} tokens exceed the Core ML draft's context of {self.context}"
            )
        pos = (
            default_positions(off, 1, T)
            if positions is None
            else np.asarray(positions, np.int64).reshape(1, T)
        )
        allowed = (
            causal_mask(off, T) if mask is None else np.asarray(mask, bool).reshape(T, off + T)
        )
        out, s = [], 0
        while s < T:
            # prefill chunks while a whole padded chunk fits in the cache, then single decode calls
            fits = T - s > 1 and off + s + self.prefill_len <= self.context
            n = min(self.prefill_len, T - s) if fits else 1
            out.append(
                self._call(
                    ids[:, s : s + n],
                    pos[:, s : s + n],
                    allowed[s : s + n, : off + s + n],
                    off + s,
                    cache,
                )
            )
            s += n
        cache.advance(T)
        return np.concatenate(out, axis=1).astype(np.float32)

    def _call(self, ids, pos, allowed, slot: int, cache: CoreMLCache) -> np.ndarray:
        """One prefill or decode call over n <= length tokens written at `slot`."""
        n = ids.shape[1]
        fn = "decode" if n == 1 else "prefill"
        length = 1 if n == 1 else self.prefill_len
        feed_ids = np.zeros((1, length), np.int32)
        feed_ids[:, :n] = ids
        feed_pos = np.zeros((1, length), np.int32)
        feed_pos[:, :n] = pos
        # padded queries: any valid position; their rows are masked and overwritten later
        feed_pos[:, n:] = pos[:, -1:]
        m = np.full((1, 1, length, self.context), NEG, np.float16)
        m[0, 0, :n, : allowed.shape[1]] = np.where(allowed, 0.0, NEG)
        m[0, 0, n:, 0] = 0.0  # padded queries see slot 0 so their softmax is finite
        feed = {
            "input_ids": feed_ids,
            "position_ids": feed_pos,
            "cache_offset": np.array([slot], np.int32),
            "attention_mask": m,
        }
        if self.stateful:
            res = self.fns[fn].predict(feed, state=cache.state)
        else:
            feed.update(k_cache=cache.k, v_cache=cache.v)
            res = self.fns[fn].predict(feed)
            cache.k[:, :, slot : slot + length] = res["k_new"]
            cache.v[:, :, slot : slot + length] = res["v_new"]
        return np.asarray(res["logits"])[:, :n]

    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        raise DuetError(
            "layer ranges are not supported on coreml (the package is one whole-model graph)"
        )

    def head(self, hidden):
        raise DuetError(
            "a separate LM head is not supported on coreml (the package is one whole-model graph)"
        )


def load_report(path) -> dict:
    """The conversion report stored in a package's metadata (any OS)."""
    from runtime.backends.coreml.spec import describe

    return describe(path)["report"] or {}
