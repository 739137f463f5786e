"""The ONNX Runtime target straight from a GGUF, one tensor at a time: no float32 checkpoint,
no float32 graph.

converters/onnx_target_export.py builds a part from a checkpoint's float weights and then
quantizes the whole graph: the model in float32 twice over (22x a 1 GB GGUF at SmolLM2-1.7B's
shape). Here the same builders (converters/onnx_target_graph.py, onnx_target_gemma3.py) run
over a `GGUFState`, which reads and dequantizes one tensor when the builder asks for it (plain
file reads, not a memory map, so the file's pages do not count as the process's memory), and a
`StreamGraph`, which quantizes each MatMul's weight the moment the builder makes it, through
the very code the whole-graph path runs on it (converters/onnx_target_quant.quantize_graph on
a one-node model): a Q4_0 / Q4_1 / Q4_K block keeps its own 4 bits exactly
(converters/onnx_grid_q4.py), a Q5 / Q6 / Q8 one takes 8 bits (the nearest wider exact form
the recipe has), the head 8 bits. The embedding is read by GatherBlockQuantized from 8-bit rows
(a Q8_0 embedding's own blocks, exactly). Every large initializer goes straight to the part's
external-data file, so the graph in memory holds names, not weights. The logits equal those of
the whole-graph export of the GGUF's dequantized checkpoint (tests/test_gguf_target.py).

GGUF tensor names and their transforms are llama.cpp's: the Llama architecture's q / k rows
are permuted for its RoPE layout and Gemma's norms are stored plus one; transformers' GGUF
tensor processors undo both (a well-kept table, used as is).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as onh

from converters.onnx_target_graph import Graph
from converters.onnx_target_quant import quantize_graph
from runtime.errors import DuetError

EXTERNAL_MIN = 1 << 16  # initializers this large go to the external-data file
ALIGN = 4096  # each at a page boundary, so ONNX Runtime can map it

# Hugging Face name (after "model.layers.{i}.") -> GGUF name (after "blk.{i}.")
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_LAYER_BY_ARCH = {  # the norms around the MLP, named per architecture
    "gemma3": {
        "post_attention_layernorm.weight": "post_attention_norm.weight",
        "pre_feedforward_layernorm.weight": "ffn_norm.weight",
        "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    },
}
_TOP = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def gguf_name(arch: str, key: str) -> str:
    """The GGUF tensor name of a Hugging Face parameter name."""
    if key in _TOP:
        return _TOP[key]
    parts = key.split(".")
    if parts[:2] != ["model", "layers"]:
        raise KeyError(key)
    rest = ".".join(parts[3:])
    table = {"post_attention_layernorm.weight": "ffn_norm.weight", **_LAYER}
    table.update(_LAYER_BY_ARCH.get(arch, {}))
    return f"blk.{parts[2]}.{table[rest]}"


class GGUFState:
    """A read-only mapping from Hugging Face parameter names to float32 arrays, each read from
    the GGUF and dequantized when asked for (nothing is kept)."""

    def __init__(self, path: Path, hf_config: dict):
        from gguf import GGUFReader
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        self.path = Path(path)
        r = GGUFReader(str(self.path))
        arch = r.fields["general.architecture"].contents()
        self.arch = arch
        # (offset, bytes, dtype, shape, type) per tensor; the reader's views are not touched
        self.tensors = {
            t.name: (int(t.data_offset), int(t.n_bytes), t.data.dtype, t.data.shape, t.tensor_type)
            for t in r.tensors
        }
        del r
        self.processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=hf_config)

    def __contains__(self, key: str) -> bool:
        try:
            return gguf_name(self.arch, key) in self.tensors
        except KeyError:
            return False

    def raw(self, name: str) -> np.ndarray:
        """A tensor's bytes as the reader would view them, read with one pread."""
        off, n, dtype, shape, _ = self.tensors[name]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            buf = os.pread(fd, n, off)
        finally:
            os.close(fd)
        if len(buf) != n:
            raise DuetError(f"{self.path}: truncated at tensor {name}")
        return np.frombuffer(buf, dtype=dtype).reshape(shape)

    def __getitem__(self, key: str):
        """The float32 array of `key`; the embedding and head as `Rows`, read when used."""
        if key in ("model.embed_tokens.weight", "lm_head.weight"):
            if key not in self:
                raise KeyError(key)
            return Rows(self, key)
        return self.array(key)

    def array(self, key: str) -> np.ndarray:
        name = gguf_name(self.arch, key)
        if name not in self.tensors:
            raise KeyError(key)
        return self.dequantized(name, self.raw(name))

    def dequantized(self, name: str, raw: np.ndarray) -> np.ndarray:
        """Float32 of `raw` (some rows of tensor `name`), with the architecture's transform."""
        from gguf.quants import dequantize

        w = dequantize(raw, self.tensors[name][4]).astype(np.float32, copy=False)
        return np.ascontiguousarray(self.processor.process(w, name).weights, dtype=np.float32)


class Rows:
    """A vocabulary-sized matrix (the embedding, an untied head) left in the GGUF until a
    graph says how it is used: a Gather reads its 8-bit rows (`rows8`), a MatMul its float
    values (`array`, transposed when `.T` was asked for, as the builders write `w.T`)."""

    def __init__(self, state: GGUFState, key: str, transposed: bool = False):
        self.state, self.key, self.transposed = state, key, transposed

    @property
    def T(self) -> Rows:
        return Rows(self.state, self.key, not self.transposed)

    def array(self) -> np.ndarray:
        w = self.state.array(self.key)
        return np.ascontiguousarray(w.T) if self.transposed else w

    def rows8(self, block: int = 32, chunk: int = 8192) -> tuple[np.ndarray, np.ndarray]:
        """(q + 128 as uint8 (N, K), scales float32 (N, K / block)): a Q8_0 tensor's own
        blocks exactly; any other type dequantized a chunk of rows at a time and rounded to
        8 bits per block (s = max |w| / 127)."""
        from gguf import GGMLQuantizationType as Q

        name = gguf_name(self.state.arch, self.key)
        raw, kind = self.state.raw(name), self.state.tensors[name][4]
        if kind == Q.Q8_0:  # 34-byte blocks: float16 d, then 32 int8 values
            N = raw.shape[0]
            b = raw.reshape(N, -1, 34)
            scales = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
            q = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
            return q.reshape(N, -1), scales
        parts_q, parts_s = [], []
        for r in range(0, raw.shape[0], chunk):
            w = self.state.dequantized(name, raw[r : r + chunk])
            wb = w.reshape(w.shape[0], -1, block)
            s = np.abs(wb).max(-1) / 127
            s = np.where(s == 0, 1.0, s).astype(np.float32)
            q = np.clip(np.rint(wb / s[..., None]), -127, 127).astype(np.int16) + 128
            parts_q.append(q.astype(np.uint8).reshape(w.shape))
            parts_s.append(s)
        return np.concatenate(parts_q), np.concatenate(parts_s)


class StreamGraph(Graph):
    """A Graph whose MatMul weights are quantized as they are made and whose large
    initializers are written to `data` (an open file named `location`) at once."""

    def __init__(self, data, location: str, rec: dict):
        super().__init__()
        self.data, self.location, self.rec = data, location, rec
        self.pending: dict[str, np.ndarray] = {}  # large floats not yet used by an op

    def init(self, name: str, arr) -> str:
        if isinstance(arr, Rows):
            self.pending[name] = arr
            return name
        arr = np.ascontiguousarray(arr)
        if arr.nbytes < EXTERNAL_MIN:
            return super().init(name, arr)
        self.pending[name] = arr
        return name

    def op(self, kind: str, ins: list[str], n_out: int = 1, domain: str = "", **kw):
        if kind == "MatMul" and ins[1] in self.pending:
            return self._quantized_matmul(ins[0], ins[1], kw.get("node"))
        if kind == "Gather" and isinstance(self.pending.get(ins[0]), Rows):
            return self._quantized_gather(ins[0], ins[1])
        for name in ins:
            if name in self.pending:  # any other use: the float tensor as it is
                self.external(onh.from_array(self._float(name), name))
        return super().op(kind, ins, n_out, domain, **kw)

    def external(self, t: TensorProto) -> None:
        """Write `t`'s data to the external file and keep only its reference."""
        raw = t.raw_data if t.HasField("raw_data") else onh.to_array(t).tobytes()
        if len(raw) < EXTERNAL_MIN:
            self.inits.append(t)
            return
        pad = -self.data.tell() % ALIGN
        self.data.write(b"\0" * pad)
        offset = self.data.tell()
        self.data.write(raw)
        t.ClearField("raw_data")
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.location), ("offset", offset), ("length", len(raw))):
            e = t.external_data.add()
            e.key, e.value = k, str(v)
        self.inits.append(t)

    def _quantized_matmul(self, x: str, wname: str, node: str | None) -> str:
        """The MatMul x @ W as the recipe quantizes it, on a one-node model; its nodes and
        initializers join this graph (its tensors' names prefixed by the node's)."""
        W = self._float(wname)
        self.n += 1
        name = node or f"MatMul_{self.n}"
        y = f"{name}_out"
        m = oh.make_model(
            oh.make_graph(
                [oh.make_node("MatMul", ["x", wname], ["y"], name=name)],
                "one",
                [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "t", W.shape[0]])],
                [oh.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                [onh.from_array(W, wname)],
            ),
            opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)],
            ir_version=9,
        )
        del W
        m = quantize_graph(m, self.rec, gguf=True)
        rename = {"x": x, "y": y}
        consts = {i.name for i in m.graph.initializer}
        for n in m.graph.node:
            n.input[:] = [
                rename.get(i, i if i in consts or not i else f"{name}/{i}") for i in n.input
            ]
            n.output[:] = [rename.get(o, f"{name}/{o}") for o in n.output]
            self.nodes.append(n)
        for t in m.graph.initializer:
            self.external(t)
        return y

    def _float(self, name: str) -> np.ndarray:
        w = self.pending.pop(name)
        return w.array() if isinstance(w, Rows) else w

    def _quantized_gather(self, table: str, ids: str) -> str:
        """The embedding lookup as GatherBlockQuantized over 8-bit rows (com.microsoft):
        a Q8_0 embedding keeps its own blocks, a row is dequantized as it is read."""
        q, s = self.pending.pop(table).rows8()
        zp = np.full(s.shape, 128, np.uint8)
        self.external(onh.from_array(q, f"{table}.q8"))
        del q
        self.external(onh.from_array(s, f"{table}.s8"))
        self.external(onh.from_array(zp, f"{table}.zp8"))
        return super().op(
            "GatherBlockQuantized",
            [f"{table}.q8", ids, f"{table}.s8", f"{table}.zp8"],
            domain="com.microsoft",
            gather_axis=0,
            quantize_axis=1,
            block_size=32,
            bits=8,
        )

    def flush(self) -> None:
        for name in list(self.pending):
            self.external(onh.from_array(self._float(name), name))


def is_gguf_description(d: Path) -> bool:
    """A checkpoint directory described from a GGUF with no weights of its own
    (runtime/gguf_import.py): its ONNX target is built from the GGUF."""
    from runtime.gguf_import import gguf_source

    return gguf_source(d) is not None and not any(Path(d).glob("*.safetensors"))


def build_from_gguf(model_dir: Path, out: Path, start, stop, head, rec: dict, taps=()):
    """Build one part of the target straight from the GGUF into `out` (+ `out`.data)."""
    from accelerate import init_empty_weights

    from runtime.backends.families import family_module
    from runtime.backends.torch import FAMILIES
    from runtime.config import ModelConfig
    from runtime.gguf_import import gguf_source

    cfg = ModelConfig.from_dir(model_dir)
    src = gguf_source(model_dir)
    if not src.is_file():
        raise DuetError(f"{model_dir}: its weights come from {src}, which is no longer there")
    fam = family_module("runtime.backends.torch", FAMILIES, cfg)
    with init_empty_weights(include_buffers=False):
        lm = fam.Model(cfg)  # for its RoPE tables alone: no weight is made
    state = GGUFState(src, json.loads((Path(model_dir) / "config.json").read_text()))
    rows = rec.get("attention", "window").startswith("rows")
    out.parent.mkdir(parents=True, exist_ok=True)
    data_path = out.with_name(out.name + ".data")
    tmp_data = data_path.with_name(data_path.name + ".tmp")
    with open(tmp_data, "wb") as data:
        g = StreamGraph(data, data_path.name, rec)
        inv_freq = lm.inv_freq.detach().float().numpy()
        if cfg.model_type == "gemma3_text":
            from converters.onnx_target_gemma3 import build_gemma_part

            ropes = {"global": inv_freq, "local": lm.inv_freq_local.detach().float().numpy()}
            m = build_gemma_part(cfg, state, ropes, start, stop, head, rows, tuple(taps), graph=g)
        else:
            from converters.onnx_target_graph import build_part

            m = build_part(cfg, state, inv_freq, start, stop, head, rows, tuple(taps), graph=g)
    tmp_data.replace(data_path)
    return m
