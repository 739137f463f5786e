"""The ONNX Runtime backend: a draft exported by `converters`, KV cache as explicit I/O.

The execution provider and thread counts are arguments (the device profile
chooses them). Only the full forward is available: an exported graph has no
layer range, so this backend is for drafts, not for an early-exit target. The target on ONNX
Runtime (`--target-backend onnx`: parts per layer range, explicit masks, int4 weights) is
runtime/backends/onnx/target.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from runtime.caches.concat import ConcatKVCache
from runtime.config import ModelConfig
from runtime.errors import DuetError
from runtime.model import causal_mask, check_tokens, default_positions

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "coreml": "CoreMLExecutionProvider",
    "qnn": "QNNExecutionProvider",
}


def key_mask(mask, batch: int, offset: int, length: int) -> np.ndarray:
    """The 2-D (B, offset + T) padding mask an optimum-style graph takes, from a protocol mask.

    The graph ANDs its input with the causal mask, so it can express exactly the masks that
    are "causal, minus some key columns per row" (a branch batch with holes in its cache);
    anything else (a tree mask) needs the mlx or torch backend.
    """
    m = np.broadcast_to(np.asarray(mask, dtype=bool), (batch, length, offset + length))
    cols = m[:, -1, :]
    if not np.array_equal(m, causal_mask(offset, length)[None] & cols[:, None, :]):
        raise DuetError(
            "the ONNX backend takes only causal masks with per-row key holes "
            "(tree verification needs mlx or torch)"
        )
    return cols.astype(np.int64)


def empty_past(config: ModelConfig, dtype):
    """batch -> an empty past (B, KV, 0, D) of `dtype` for `config`'s attention layers."""
    return lambda b: np.zeros((b, config.num_kv_heads, 0, config.head_dim), dtype)


def run_with_past(session, outputs: list[str], feed: dict, cache, layers: int, first: int):
    """Run `session` with the cache's past keys and values of layers [0, layers) added to
    `feed` (past_key_values.{i}.key / .value) and put its presents (the outputs from `first`
    on, a key and a value a layer) back into the cache; returns the outputs."""
    for i in range(layers):
        k, v = cache.get(i)
        feed[f"past_key_values.{i}.key"] = np.ascontiguousarray(k)
        feed[f"past_key_values.{i}.value"] = np.ascontiguousarray(v)
    res = session.run(outputs, feed)
    for i in range(layers):
        cache.put(i, res[first + 2 * i], res[first + 2 * i + 1])
    return res


def open_session(path, provider: str, intra_threads: int, inter_threads: int, spin: bool = True):
    """An ONNX Runtime session on `provider` with these thread counts; bad input is a DuetError.
    `spin` False: its pool's threads sleep between runs instead of spinning (sessions run one
    after another, as the ONNX target's parts, would otherwise spin against each other)."""
    import onnxruntime as ort

    if provider not in PROVIDERS:
        raise DuetError(
            f"unknown ONNX Runtime provider {provider!r}; choose from {', '.join(PROVIDERS)}"
        )
    ep = PROVIDERS[provider]
    if ep not in ort.get_available_providers():
        raise DuetError(
            f"ONNX Runtime provider {provider!r} ({ep}) is not available in this build; "
            f"available: {', '.join(ort.get_available_providers())}"
        )
    so = ort.SessionOptions()
    so.intra_op_num_threads = intra_threads
    so.inter_op_num_threads = inter_threads
    if not spin:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        session = ort.InferenceSession(str(path), so, providers=[ep])
    except Exception as e:  # ORT raises its own types for a bad file
        raise DuetError(
            f"{path}: ONNX Runtime could not load it ({str(e).splitlines()[0]})"
        ) from None
    return session


class OnnxCausalLM:
    """CausalLM over an ONNX file with optimum/onnxruntime-genai I/O names."""

    backend = "onnx"
    supports_layer_range = False

    def __init__(
        self,
        path,
        config: ModelConfig | None,
        provider: str = "cpu",
        intra_threads: int = 1,
        inter_threads: int = 1,
    ):
        self.session = open_session(path, provider, intra_threads, inter_threads)
        self.config = config  # None until `load` reads it from the file's metadata
        self.provider = provider
        self.threads = (intra_threads, inter_threads)
        names = {i.name: i for i in self.session.get_inputs()}
        missing = {"input_ids", "attention_mask", "position_ids", "past_key_values.0.key"} - set(
            names
        )
        if missing:
            raise DuetError(
                f"{path}: not a Duet/optimum decoder export (missing inputs {sorted(missing)})"
            )
        self._kv_dtype = (
            np.float16 if "float16" in names["past_key_values.0.key"].type else np.float32
        )
        self._outputs = [o.name for o in self.session.get_outputs()]

    @classmethod
    def load(cls, onnx_path, config_dir=None, **kw) -> OnnxCausalLM:
        """Load a Llama / Qwen2 / Qwen3 export at `onnx_path` (runtime/backends/onnx/__init__.py
        picks the family's class). The config comes from `config_dir`, else the `duet.config`
        metadata our exporter embeds, else a config.json beside the file."""
        p = Path(onnx_path)
        if not p.is_file():
            raise DuetError(f"ONNX draft not found: {p}")
        return cls(p, onnx_config(p, config_dir), **kw)

    def new_cache(self, batch: int = 1) -> ConcatKVCache:
        return ConcatKVCache(self.config.num_layers, batch, empty_past(self.config, self._kv_dtype))

    def forward(self, tokens, cache, *, positions=None, mask=None) -> np.ndarray:
        ids = check_tokens(tokens, self.config.vocab_size)
        B, T = ids.shape
        off = cache.offset
        feed = {
            "input_ids": ids,
            "attention_mask": np.ones((B, off + T), np.int64)
            if mask is None
            else key_mask(mask, B, off, T),
            "position_ids": default_positions(off, B, T)
            if positions is None
            else np.asarray(positions, np.int64),
        }
        res = run_with_past(self.session, self._outputs, feed, cache, self.config.num_layers, 1)
        return res[0].astype(np.float32, copy=False)

    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        raise DuetError(
            "the ONNX backend runs whole models only; "
            "use --draft-backend mlx or torch for layer ranges"
        )

    def head(self, hidden):
        raise DuetError("the ONNX backend runs whole models only; it has no separate LM head")


def onnx_config(path, config_dir=None) -> ModelConfig:
    """The config of the export at `path`: `config_dir`'s, else the `duet.config` metadata
    our exporter embeds, else a config.json beside the file."""
    if config_dir is not None:
        return ModelConfig.from_dir(config_dir)
    return _file_config(Path(path))


def _file_config(p: Path) -> ModelConfig:
    """The `duet.config` our exporter embeds in the file's metadata, else config.json beside it."""
    import onnx

    try:
        meta = {m.key: m.value for m in onnx.load(str(p), load_external_data=False).metadata_props}
    except Exception as e:  # not ONNX at all
        raise DuetError(f"{p}: ONNX Runtime could not load it ({str(e).splitlines()[0]})") from None
    if "duet.config" in meta:
        return ModelConfig.from_dict(json.loads(meta["duet.config"]), where=f"{p} metadata")
    return ModelConfig.from_dir(p.parent)


def load(path, config: ModelConfig, **kw) -> OnnxCausalLM:
    """This family's entry in runtime/backends/onnx/__init__.py's FAMILIES."""
    return OnnxCausalLM(path, config, **kw)
