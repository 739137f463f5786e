"""The host side of a static-shape ONNX draft: a fixed cache buffer driven through the
`decode` (T = 1) and `prefill` (T = P) graphs of converters/onnx_static.py.

It implements the CausalLM protocol (batch 1, whole model), so the same parity
check and the companion app's reference client run it like any backend.
Rollback is moving the offset: slots at or past it are masked out and the
next call overwrites them.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from runtime.caches.slots import OneRowSlots
from runtime.config import ModelConfig
from runtime.errors import DuetError
from runtime.model import check_tokens


def graph_paths(out: str | Path) -> dict[str, Path]:
    """{"decode": out, "prefill": out with `.prefill.onnx`}: the two files of one export."""
    out = Path(out)
    if out.suffix != ".onnx":
        raise DuetError(f"{out}: an ONNX output path must end in .onnx")
    return {"decode": out, "prefill": out.with_name(out.stem + ".prefill.onnx")}


def full_range_u8s8(rec: dict | None) -> bool:
    """Whether a recorded recipe can clip in ORT's CPU U8S8 kernel on a CPU without VNNI."""
    return (
        bool(rec)
        and rec.get("scheme") == "int8"
        and rec.get("activation") == "QUInt8"
        and rec.get("weight") == "QInt8"
        and not rec.get("reduce_range")
    )


class StaticCache(OneRowSlots):
    """Batch-1 cache of C slots: keys and values (L, KV, C, D) and an offset."""

    holder = "a static-shape ONNX draft"

    def __init__(self, shape: tuple[int, ...], dtype=np.float32):
        self.k = np.zeros(shape, dtype)
        self.v = np.zeros(shape, dtype)
        self._offset = 0


class StaticOnnxLM:
    """CausalLM over a static export's decode and prefill graphs (ONNX Runtime)."""

    backend = "onnx"
    supports_layer_range = False

    def __init__(self, sessions: dict, config: ModelConfig, context: int, prefill_len: int):
        self.sessions, self.config = sessions, config
        self.context, self.prefill_len = context, prefill_len
        self._outputs = [o.name for o in sessions["decode"].get_outputs()]
        self.recorder: list | None = None  # (graph name, feed) pairs, for quantization calibration
        self.quantization: dict | None = None  # the recipe in duet.quantization, if quantized
        self.qdq_path = "fp32"  # which kernels run the graph (see load)

    @classmethod
    def load(
        cls, decode_path, provider: str = "CPUExecutionProvider", threads: int = 1
    ) -> StaticOnnxLM:
        """Load `decode_path` and its `.prefill.onnx` sibling.

        A full-range U8S8 artefact (made for QNN) on the CPU provider of a CPU whose int8
        kernel saturates (x86-64 without VNNI) runs its QDQ graph unfused: dequantize +
        float ops, the graph's exact semantics, instead of the clipping int8 kernel.
        `qdq_path` says which path runs.
        """
        from runtime.backends.onnx.cpu_int8 import int8_path

        paths = graph_paths(decode_path)
        for p in paths.values():
            if not p.is_file():
                raise DuetError(f"static ONNX graph not found: {p}")
        meta = cls.describe(paths["decode"])  # (validates the file before ORT sees it)
        if "duet.static" not in meta or "duet.config" not in meta:
            raise DuetError(
                f"{decode_path}: not a Duet static-shape export (no duet.static metadata)"
            )
        cpu = int8_path()
        unfuse = (
            provider == "CPUExecutionProvider"
            and full_range_u8s8(meta.get("duet.quantization"))
            and cpu.saturates_u8s8
        )
        sessions = {name: _session(p, provider, threads, unfuse) for name, p in paths.items()}
        prefill_meta = json.loads(
            sessions["prefill"].get_modelmeta().custom_metadata_map["duet.static"]
        )
        config = ModelConfig.from_dict(meta["duet.config"], where=f"{decode_path} metadata")
        lm = cls(sessions, config, meta["duet.static"]["context"], prefill_meta["query_len"])
        lm.quantization = meta.get("duet.quantization")
        lm.qdq_path = (
            "fp32"
            if lm.quantization is None
            else f"{provider}: "
            + ("QDQ unfused (exact)" if unfuse else "fused int8 kernels")
            + (f" on {cpu.name}" if provider == "CPUExecutionProvider" else "")
        )
        return lm

    @staticmethod
    def describe(decode_path: str | Path) -> dict:
        """The duet.* metadata of a static export (no session needed)."""
        import onnx

        try:
            m = onnx.load(str(decode_path), load_external_data=False)
        except Exception as e:  # protobuf raises its own types for a truncated or foreign file
            raise DuetError(
                f"{decode_path}: not a readable ONNX file ({str(e).splitlines()[0]})"
            ) from None
        return {p.key: json.loads(p.value) for p in m.metadata_props if p.key.startswith("duet.")}

    def new_cache(self, batch: int = 1) -> StaticCache:
        if batch != 1:
            raise DuetError(f"a static-shape ONNX draft runs batch 1 only (asked for {batch} rows)")
        c = self.config
        return StaticCache((c.num_layers, c.num_kv_heads, self.context, c.head_dim))

    def forward(self, tokens, cache: StaticCache, *, positions=None, mask=None) -> np.ndarray:
        if mask is not None or positions is not None:
            raise DuetError("a static-shape ONNX draft takes no explicit mask or positions")
        ids = check_tokens(tokens, self.config.vocab_size)
        if ids.shape[0] != 1:
            raise DuetError(
                f"a static-shape ONNX draft runs batch 1 only (got {ids.shape[0]} rows)"
            )
        T = ids.shape[1]
        if cache.offset + T > self.context:
            raise DuetError(
                f"{cache.offset + T} tokens exceed the static draft's context of {self.context}"
            )
        out, s = [], 0
        while s < T:
            # whole prefill chunks while a padded chunk fits the cache, then single decode steps
            fits = T - s > 1 and cache.offset + self.prefill_len <= self.context
            n = min(self.prefill_len, T - s) if fits else 1
            out.append(self._call(ids[:, s : s + n], cache, self.prefill_len if fits else 1))
            s += n
        return np.concatenate(out, axis=1).astype(np.float32, copy=False)

    def _call(self, ids: np.ndarray, cache: StaticCache, length: int) -> np.ndarray:
        n, off, C = ids.shape[1], cache.offset, self.context
        feed_ids = np.zeros((1, length), np.int64)
        feed_ids[:, :n] = ids
        am = np.zeros((1, C + length), np.int64)
        am[0, :off] = 1  # live cache slots
        am[0, C : C + length] = 1  # new tokens (causal among themselves inside the graph)
        feed = {
            "input_ids": feed_ids,
            "attention_mask": am,
            "position_ids": np.arange(off, off + length, dtype=np.int64)[None],
        }
        for i in range(self.config.num_layers):
            feed[f"past_key_values.{i}.key"] = cache.k[i][None]
            feed[f"past_key_values.{i}.value"] = cache.v[i][None]
        graph = "decode" if length == 1 else "prefill"
        if self.recorder is not None:
            self.recorder.append((graph, {k: v.copy() for k, v in feed.items()}))
        res = self.sessions[graph].run(self._outputs, feed)
        for i in range(self.config.num_layers):
            cache.k[i, :, off : off + n] = res[1 + 2 * i][0, :, :n]
            cache.v[i, :, off : off + n] = res[2 + 2 * i][0, :, :n]
        cache.advance(n)
        return res[0][:, :n]

    def forward_layers(self, x, cache, start, stop, *, positions=None, mask=None):
        raise DuetError("a static-shape ONNX draft runs whole models only (no layer ranges)")

    def head(self, hidden):
        raise DuetError("a static-shape ONNX draft runs whole models only (no separate LM head)")


def _session(path: Path, provider: str, threads: int, unfuse_qdq: bool):
    """One ORT session; `unfuse_qdq` keeps QDQ nodes as dequantize + float ops."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if unfuse_qdq:
        so.add_session_config_entry("session.disable_quant_qdq", "1")
    try:
        return ort.InferenceSession(str(path), so, providers=[provider])
    except Exception as e:  # ORT raises its own types for a bad file
        raise DuetError(
            f"{path}: ONNX Runtime could not load it ({str(e).splitlines()[0]})"
        ) from None
