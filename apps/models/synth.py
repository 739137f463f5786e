"""`python -m apps.models synth SHAPE --out FILE.gguf [--quant Q4_0]`: a GGUF with a real
model's exact shape (apps/models/shapes.py) and random weights, to measure speed, memory and load
costs at the sizes users run. Acceptance on such a file means nothing: take tokens per step
from the real models.

Written with the `gguf` package's writer (llama.cpp's own Python writer), streamed: the header
first, then one tensor at a time, so writing an 8 B file holds one tensor in memory, not the
model. Each quantized tensor is random *blocks*: random bytes in the quantized values, and each
block's scale fields set so the dequantized weights have a standard deviation near 0.02 (no
float matrix is made and quantized, which is what makes this fast). The tokenizer, its merges
and the chat template are copied from the donor model's GGUF in the registry (SmolLM2-135M's or
Gemma 3 270M's: `python -m apps.models pull NAME` first). The file says what it is:
general.name and general.description name the shape and "random weights", and `duet.random` is
true; every figure measured on it must say so too.

The quant mixes follow llama.cpp's `llama-quantize` rules closely enough for cost: Q4_0, Q4_1,
Q8_0 and F16 use one type for every linear weight (the embedding, and an untied head, Q8_0 under
the 4-bit types, as the issue's 1.7 B figures were taken); Q4_K_M and Q5_K_M give attn_v and
ffn_down Q6_K on llama.cpp's `use_more_bits` layers and Q6_K to the head (the embedding, when
tied); Q6_K is Q6_K throughout. A K-quant needs rows of 256; a narrower row falls back as
llama.cpp's does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from apps.models.shapes import Shape
from runtime.errors import DuetError

MIXES = ("Q4_0", "Q4_1", "Q8_0", "F16", "Q4_K_M", "Q5_K_M", "Q6_K")
STD = 0.02
# scale fields per block type: (byte offset of d, d's value, offset of the min, min / d).
# d makes the block's values' spread near STD: random q uniform over the type's range.
# fmt: off
_SCALES = {
    "Q4_0": (0, STD / 4.6, None, 0.0),  "Q4_1": (0, STD / 4.6, 2, -8.0),
    "Q5_0": (0, STD / 9.2, None, 0.0),  "Q5_1": (0, STD / 9.2, 2, -16.0),
    "Q8_0": (0, STD / 74, None, 0.0),
    "Q4_K": (0, STD / 300, 2, 7.5),     "Q5_K": (0, STD / 650, 2, 15.5),
    "Q6_K": (208, STD / 1365, None, 0.0),
}
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
_FILE_TYPE = {"F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}
# fmt: on


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule for which layers' attn_v / ffn_down get more bits in a _M mix."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(mix: str, role: str, layer: int, n_layers: int, in_dim: int) -> str:
    """The GGML type of one linear weight under a mix (role: embed, output, or a blk name)."""
    if mix in ("Q4_0", "Q4_1", "Q8_0", "F16"):
        t = "Q8_0" if role in ("embed", "output") and mix != "F16" else mix
    elif mix == "Q6_K":
        t = "Q6_K"
    else:
        base = "Q4_K" if mix == "Q4_K_M" else "Q5_K"
        more = role in ("attn_v", "ffn_down") and use_more_bits(layer, n_layers)
        t = "Q6_K" if role in ("embed", "output") or more else base
    if t in _FALLBACK and in_dim % 256:
        t = _FALLBACK[t]
    return t


def tensors(s: Shape, vocab: int, mix: str):
    """(name, numpy shape (rows, cols), GGML type name) of every tensor, in file order."""
    C, D, L = s.hidden, s.head_dim, s.layers
    yield "token_embd.weight", (vocab, C), tensor_type(mix, "embed", 0, L, C)
    for i in range(L):
        b = f"blk.{i}."
        lin = {
            "attn_q": (s.heads * D, C),
            "attn_k": (s.kv_heads * D, C),
            "attn_v": (s.kv_heads * D, C),
            "attn_output": (C, s.heads * D),
            "ffn_gate": (s.ffn, C),
            "ffn_up": (s.ffn, C),
            "ffn_down": (C, s.ffn),
        }
        norms = ["attn_norm", "ffn_norm"]
        if s.arch in ("qwen3", "gemma3"):
            yield b + "attn_q_norm.weight", (D,), "F32"
            yield b + "attn_k_norm.weight", (D,), "F32"
        if s.arch == "gemma3":
            norms += ["post_attention_norm", "post_ffw_norm"]
        for n in norms:
            yield b + n + ".weight", (C,), "F32"
        for n, shp in lin.items():
            yield b + n + ".weight", shp, tensor_type(mix, n, i, L, shp[1])
    yield "output_norm.weight", (C,), "F32"
    if not s.tied:
        yield "output.weight", (vocab, C), tensor_type(mix, "output", 0, L, C)


def random_tensor(shape: tuple, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Random data of one tensor: float values, or raw quantized blocks (uint8 (rows, bytes))."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    if kind == "F32":  # norms: near 1, as trained ones are
        return (1.0 + 0.02 * rng.standard_normal(shape)).astype(np.float32)
    if kind == "F16":
        return (STD * rng.standard_normal(shape)).astype(np.float16)
    block, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[kind]]
    rows, cols = shape
    raw = rng.integers(0, 256, (rows, cols // block, nbytes), dtype=np.uint8)
    at, d, m_at, m_ratio = _SCALES[kind]
    raw[..., at : at + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    if m_at is not None:
        raw[..., m_at : m_at + 2] = np.frombuffer(np.float16(d * m_ratio).tobytes(), np.uint8)
    return raw.reshape(rows, -1)


def donor_fields(donor_gguf: Path) -> list:
    """The donor's tokenizer.* fields (tokens, merges, scores, types, ids, template)."""
    from gguf import GGUFReader

    r = GGUFReader(str(donor_gguf))
    return [f for k, f in r.fields.items() if k.startswith("tokenizer.")]


def copy_field(w, f) -> None:
    from gguf import GGUFValueType

    vtype = f.types[0]
    sub = f.types[-1] if vtype == GGUFValueType.ARRAY else None
    w.add_key_value(f.name, f.contents(), vtype, sub)


def write_header(w, s: Shape, vocab: int, mix: str, fields: list) -> None:
    a = s.arch
    w.add_name(f"random-weights {s.name} shape ({mix})")
    w.add_description(
        f"Duet synth: {s.name}'s exact shape with RANDOM weights (not a trained model); "
        f"tokenizer from {s.donor}"
        + (
            f", vocabulary {vocab} (the real model has {s.real_vocab})"
            if vocab != s.real_vocab
            else ""
        )
    )
    w.add_bool("duet.random", True)
    w.add_string("duet.shape", s.name)
    w.add_uint32(f"{a}.block_count", s.layers)
    w.add_uint32(f"{a}.context_length", s.context)
    w.add_uint32(f"{a}.embedding_length", s.hidden)
    w.add_uint32(f"{a}.feed_forward_length", s.ffn)
    w.add_uint32(f"{a}.attention.head_count", s.heads)
    w.add_uint32(f"{a}.attention.head_count_kv", s.kv_heads)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", s.eps)
    w.add_float32(f"{a}.rope.freq_base", s.rope_base)
    w.add_uint32(f"{a}.attention.key_length", s.head_dim)
    w.add_uint32(f"{a}.attention.value_length", s.head_dim)
    if a == "llama":
        w.add_uint32(f"{a}.rope.dimension_count", s.head_dim)
        w.add_uint32(f"{a}.vocab_size", vocab)
    if s.sliding_window:
        w.add_uint32(f"{a}.attention.sliding_window", s.sliding_window)
    w.add_uint32("general.file_type", _FILE_TYPE[mix])
    w.add_uint32("general.quantization_version", 2)
    for f in fields:
        copy_field(w, f)


def synth(s: Shape, out: Path, mix: str = "Q4_0", seed: int = 0, donor_gguf: Path | None = None):
    """Write `out`; returns its size in bytes. Streams: one tensor in memory at a time."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter

    if mix not in MIXES:
        raise DuetError(f"--quant {mix}: one of {', '.join(MIXES)}")
    donor_gguf = donor_gguf or donor_path(s.donor)
    fields = donor_fields(donor_gguf)
    vocab = len(next(f for f in fields if f.name == "tokenizer.ggml.tokens").data)
    plan = list(tensors(s, vocab, mix))
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    w = GGUFWriter(str(tmp), s.arch)
    write_header(w, s, vocab, mix, fields)
    for name, shp, kind in plan:
        qt = GGMLQuantizationType[kind]
        block, nbytes = GGML_QUANT_SIZES[qt]
        n = int(np.prod(shp)) // block * nbytes
        w.add_tensor_info(name, shp, np.float32 if kind == "F32" else np.float16, n, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    from tqdm import tqdm

    for _name, shp, kind in tqdm(
        plan, desc=f"synth {s.name} {mix}", unit="tensor", file=sys.stderr
    ):
        w.write_tensor_data(random_tensor(shp, kind, rng))
    w.close()
    tmp.replace(out)
    return out.stat().st_size


def donor_path(name: str) -> Path:
    from runtime.registry import KNOWN, model_home

    p = model_home(name) / KNOWN[name].gguf_name
    if not p.is_file():
        raise DuetError(f"the tokenizer comes from {name}: run `python -m apps.models pull {name}`")
    return p
