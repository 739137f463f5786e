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

The GGUF's tensors come through converters/gguf_state.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from onnx import NodeProto, TensorProto
from onnx import helper as oh
from onnx import numpy_helper as onh

from converters.gguf_state import GGUFState, Packed, Rows
from converters.onnx_target_family import build_family_part
from converters.onnx_target_graph import HEAD_NODE, MS, Graph, Span
from converters.onnx_target_quant import quantize_graph
from runtime.errors import DuetError

EXTERNAL_MIN = 1 << 16  # initializers this large go to the external-data file
ALIGN = 4096  # each at a page boundary, so ONNX Runtime can map it


class StreamGraph(Graph):
    """A Graph whose MatMul weights are quantized as they are made and whose large
    initializers are written to `data` (an open file named `location`) at once."""

    def __init__(self, data, location: str, rec: dict):
        super().__init__()
        self.data, self.location, self.rec = data, location, rec
        # large initializers not yet used by an op: float arrays, or GGUF weights still in blocks
        self.pending: dict[str, np.ndarray | Rows | Packed] = {}

    def init(self, name: str, arr) -> str:
        if isinstance(arr, (Rows, Packed)):
            self.pending[name] = arr
            return name
        arr = np.ascontiguousarray(arr)
        if arr.nbytes < EXTERNAL_MIN:
            return super().init(name, arr)
        self.pending[name] = arr
        return name

    def op(self, kind: str, ins: list[str], n_out: int = 1, domain: str = "", **kw):
        if kind == "MatMul" and ins[1] in self.pending:
            w = self.pending[ins[1]]
            if (
                isinstance(w, Packed)
                and kw.get("node") == HEAD_NODE
                and self.rec.get("head_bits") == 8
            ):
                return self._head8(ins[0], self.pending.pop(ins[1]))
            if isinstance(w, Packed) and w.kinds == {"Q4_0"} and self.rec["bits"] == 4:
                return self._q4_0(ins[0], self.pending.pop(ins[1]))
            return self._quantized_matmul(ins[0], ins[1], kw.get("node"))
        if kind == "Gather" and isinstance(self.pending.get(ins[0]), Rows):
            got = self.pending[ins[0]].rows8()
            if got is not None:
                self.pending.pop(ins[0])
                return self._quantized_gather(ins[0], ins[1], *got)
        for name in ins:
            if name in self.pending:  # any other use: the float tensor as it is
                self.external(onh.from_array(self._float(name), name))
        return super().op(kind, ins, n_out, domain, **kw)

    def external(self, t: TensorProto) -> None:
        """Write `t`'s data to the external file and keep a new proto that only refers to it.
        New protos, never `t` itself: a message keeps the arena it was made in alive (upb),
        and a one-node model's arena holds its float weight (330 MB a layer at 1.7 B)."""
        raw = t.raw_data if t.HasField("raw_data") else onh.to_array(t).tobytes()
        kept = TensorProto()
        if len(raw) < EXTERNAL_MIN:
            kept.CopyFrom(t)
            self.inits.append(kept)
            return
        pad = -self.data.tell() % ALIGN
        self.data.write(b"\0" * pad)
        offset = self.data.tell()
        self.data.write(raw)
        kept.name, kept.data_type = t.name, t.data_type
        kept.dims.extend(t.dims)
        kept.data_location = TensorProto.EXTERNAL
        for k, v in (("location", self.location), ("offset", offset), ("length", len(raw))):
            e = kept.external_data.add()
            e.key, e.value = k, str(v)
        self.inits.append(kept)

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
        for old in m.graph.node:
            n = NodeProto()
            n.CopyFrom(old)  # out of the one-node model's arena (see `external`)
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
        return w.array() if isinstance(w, (Rows, Packed)) else w

    def _q4_0(self, x: str, w: Packed) -> str:
        """A Q4_0 weight as one MatMulNBits over its own nibbles and scales: no float copy,
        no correction nodes."""
        q, d, K = w.q4_0()
        self.n += 1
        name = f"MatMul_{self.n}"
        self.external(onh.from_array(q, f"{name}.q"))
        self.external(onh.from_array(d.reshape(-1), f"{name}.d"))
        return super().op(
            "MatMulNBits",
            [x, f"{name}.q", f"{name}.d"],
            domain=MS,
            K=K,
            N=q.shape[0],
            bits=4,
            block_size=32,
            accuracy_level=self.rec["accuracy_level"],
        )

    def _head8(self, x: str, w: Packed) -> str:
        """The LM head at 8 bits (the recipe's head_bits), made a chunk of rows at a time: two
        4-bit halves, or one 8-bit MatMulNBits on a VNNI CPU (converters/onnx_head_split.py)."""
        from converters.onnx_head_split import one8_nodes, split_nodes
        from runtime.backends.onnx.target import HEAD_ACCURACY_LEVEL

        one = self.rec.get("int8_as", "").startswith("one")
        q8, s = w.int8(127 if one else 119)
        K = q8.shape[1] * q8.shape[2]
        y = f"{HEAD_NODE}_out"
        nodes, inits = (one8_nodes if one else split_nodes)(
            x, y, HEAD_NODE, K, q8, s, 32, HEAD_ACCURACY_LEVEL
        )
        del q8, s
        self.nodes += nodes
        for t in inits:
            self.external(t)
        return y

    def _quantized_gather(self, table: str, ids: str, q, s, block: int) -> str:
        """The embedding lookup as GatherBlockQuantized over 8-bit rows (com.microsoft) that
        hold the GGUF's values exactly (gguf_state.Rows.rows8); a row is dequantized as it is
        read. An embedding without such a form stays float32 (a Gather of the mapped rows)."""
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
            block_size=block,
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
    from runtime.backends.torch import FAMILIES, torch_family
    from runtime.config import ModelConfig
    from runtime.gguf_import import gguf_source

    cfg = ModelConfig.from_dir(model_dir)
    src = gguf_source(model_dir)
    if not src.is_file():
        raise DuetError(f"{model_dir}: its weights come from {src}, which is no longer there")
    fam, fam_name = family_module("runtime.backends.torch", FAMILIES, cfg), torch_family(cfg)
    with init_empty_weights(include_buffers=False):
        lm = fam.Model(cfg)  # for its RoPE tables alone: no weight is made
    state = GGUFState(src, json.loads((Path(model_dir) / "config.json").read_text()))
    bar = _progress(state, src, start, stop, head, cfg.num_layers)
    rows = rec.get("attention", "window").startswith("rows")
    out.parent.mkdir(parents=True, exist_ok=True)
    data_path = out.with_name(out.name + ".data")
    tmp_data = data_path.with_name(data_path.name + ".tmp")
    with open(tmp_data, "wb") as data:
        g = StreamGraph(data, data_path.name, rec)
        span = Span(start, stop, head, rows, tuple(taps))
        m = build_family_part(fam_name, cfg, state, lm, span, graph=g)
    bar.close()
    tmp_data.replace(data_path)
    del g, state, lm
    give_back_heap()
    return m


def _progress(state: GGUFState, src: Path, start: int, stop: int, head: bool, n: int):
    """A bar over the bytes this part reads from the GGUF (its layers' share of the tensors,
    and the embedding and head where it has them), with tqdm's estimate of the time left; on
    stderr, off when stderr is not a terminal. The build happens once per model: later runs
    load the cached graph."""
    import sys

    from tqdm import tqdm

    def mine(name: str) -> bool:
        if name.startswith("blk."):
            return start <= int(name.split(".")[1]) < stop
        return start == 0 or head  # the embedding, the final norm and the head

    total = sum(t[1] for name, t in state.tensors.items() if mine(name))
    desc = f"building the ONNX target from {src.name} (once; later runs load it)"
    bar = tqdm(total=total, unit="B", unit_scale=True, file=sys.stderr, disable=None, desc=desc)
    state.progress = bar.update
    return bar


def give_back_heap() -> None:
    """Hand the heap the build freed back to the system (glibc keeps freed pages otherwise),
    so the session that loads the part next starts from the process's baseline."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to hand back
        pass
