"""A GGUF's tensors as the ONNX target's graph builders ask for them, read one at a time
(plain reads, not a memory map, so the file's pages never count as the process's memory):
`GGUFState` maps Hugging Face parameter names to float32 arrays, and hands over the embedding
(`Rows`) and every MatMul's packed weight (`Packed`) still in the GGUF's own blocks, for
converters/gguf_target.StreamGraph to quantize as it chooses.

GGUF tensor names and their transforms are llama.cpp's: the Llama architecture's q / k rows
are permuted for its RoPE layout and Gemma's norms are stored plus one; transformers' GGUF
tensor processors undo both (a well-kept table, used as is).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from runtime.errors import DuetError

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
        self.progress = None  # called with each tensor's bytes as it is read (a progress bar)

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
        if self.progress is not None:
            self.progress(n)
        return np.frombuffer(buf, dtype=dtype).reshape(shape)

    def matmul_weight(self, keys: list[str]) -> Packed:
        for k in keys:
            if k not in self:
                raise KeyError(k)
        return Packed(self, keys)

    def __getitem__(self, key: str):
        """The float32 array of `key`; the embedding as `Rows`, read when a graph uses it (every
        MatMul weight, the head's too, comes through `matmul_weight`)."""
        if key == "model.embed_tokens.weight":
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
    """The embedding, left in the GGUF until a graph says how it is used: a Gather reads its
    8-bit rows (`rows8`), any other use its float values (`array`)."""

    def __init__(self, state: GGUFState, key: str):
        self.state, self.key = state, key

    def array(self) -> np.ndarray:
        return self.state.array(self.key)

    def rows8(self, chunk: int = 8192):
        """(q + 128 as uint8 (N, K), scales float32 (N, K / block), block) where 8-bit blocks
        hold the tensor exactly: Q8_0 (its own blocks of 32), Q6_K (d * scale per 16 values,
        q - 32 in [-32, 31]) and Q4_0 / Q5_0 (d per 32, q - 8 or q - 16). Else None: an
        affine block (a float minimum) has no exact 8-bit form, and the float rows are used."""
        from gguf import GGMLQuantizationType as Q

        name = gguf_name(self.state.arch, self.key)
        raw, kind = self.state.raw(name), self.state.tensors[name][4]
        N = raw.shape[0]
        if kind == Q.Q8_0:  # 34-byte blocks: float16 d, then 32 int8 values
            b = raw.reshape(N, -1, 34)
            scales = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32)
            q = (b[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)
            return q.reshape(N, -1), scales, 32
        if kind == Q.Q6_K:  # 210-byte blocks of 256: ..., int8 scales[16] at 192, d at 208
            b = raw.reshape(N, -1, 210)
            d = b[..., 208:210].copy().view(np.float16).astype(np.float32)  # (N, nb, 1)
            scales = (d * b[..., 192:208].view(np.int8)).reshape(N, -1)  # per 16 values
            block = 16
        elif kind in (Q.Q4_0, Q.Q5_0):  # float16 d first, per 32 values
            b = raw.reshape(N, -1, 18 if kind == Q.Q4_0 else 22)
            scales, block = b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32), 32
        else:
            return None
        parts = []
        for r in range(0, N, chunk):
            wb = self.state.dequantized(name, raw[r : r + chunk]).reshape(
                min(chunk, N - r), -1, block
            )
            s = scales[r : r + chunk]
            q = np.rint(wb / np.where(s == 0, 1.0, s)[..., None]).astype(np.int16) + 128
            parts.append(q.astype(np.uint8).reshape(wb.shape[0], -1))
        return np.concatenate(parts), scales.astype(np.float32), block


class Packed:
    """A MatMul's (K, N) weight: the rows of GGUF tensors packed along N (q|k|v, gate|up, one
    projection, the head), left in the GGUF until the graph quantizes it."""

    def __init__(self, state: GGUFState, keys: list[str]):
        self.state, self.keys = state, keys
        self.names = [gguf_name(state.arch, k) for k in keys]
        self.kinds = {state.tensors[n][4].name for n in self.names}

    def array(self) -> np.ndarray:
        """Float32 (K, N)."""
        return np.ascontiguousarray(np.concatenate([self.state.array(k) for k in self.keys]).T)

    def rows(self):
        """Each tensor's raw rows in the order the float weights have them (the
        architecture's row permutation, llama q / k, applied to whole rows)."""
        for name in self.names:
            raw = self.state.raw(name)
            idx = np.arange(raw.shape[0], dtype=np.float32)[:, None]
            perm = self.state.processor.process(idx, name).weights[:, 0].astype(np.int64)
            yield name, raw if (perm == np.arange(raw.shape[0])).all() else raw[perm]

    def q4_0(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(nibbles packed as MatMulNBits reads them (N, nb, 16), scales (N, nb), K) of Q4_0
        rows: w = d (q - 8), MatMulNBits' symmetric form exactly (its implicit zero point 8)."""
        qs, ds = [], []
        for _, raw in self.rows():
            b = raw.reshape(raw.shape[0], -1, 18)  # float16 d, 16 bytes: q[j] | q[j + 16] << 4
            ds.append(b[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
            q = np.concatenate([b[..., 2:] & 0xF, b[..., 2:] >> 4], axis=-1)  # (N, nb, 32)
            qs.append((q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8))
        return np.concatenate(qs), np.concatenate(ds), qs[0].shape[1] * 32

    def int8(self, top: int, block: int = 32, chunk: int = 4096):
        """(q8 (N, nb, block) int8, scales (N, nb)) as converters/onnx_head_split.int8_of
        makes them, a chunk of rows dequantized at a time."""
        from converters.onnx_head_split import int8_of

        qs, ss = [], []
        for name, raw in self.rows():
            for r in range(0, raw.shape[0], chunk):
                q, s = int8_of(self.state.dequantized(name, raw[r : r + chunk]).T, block, top)
                qs.append(q)
                ss.append(s)
        return np.concatenate(qs), np.concatenate(ss)
