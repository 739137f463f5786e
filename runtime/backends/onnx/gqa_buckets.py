"""Where ONNX Runtime's GroupQueryAttention changes how it sums a row, measured on this machine.

The ONNX target (runtime/backends/onnx/target.py) keeps every pass bit-equal to one-token
passes at int8 activations, which needs GQA's multi-query path to give a row the same result
whatever pass computes it. It does while the pass's key count stays in one "bucket": on this
repository's x86 (AVX-512) build, with 256-wide heads (Gemma 3) a row's sums change when the key
count crosses 64, 192, 320, ... (64 + 128 k), and with 64- or 128-wide heads never (see
KEY_BUCKETS there for the measurements). Another CPU or ONNX Runtime build may bucket
elsewhere, so the boundaries are measured here, once per process and head shape, on a bare GQA
node with random inputs: row p computed in a 2-row pass (p + 2 keys, what a padded one-token
pass uses) and in a 3-row pass (p + 3 keys); where the two differ, rows up to p and rows from
p + 1 on must not share a pass, so a pass is cut before position p + 1.

Probed up to PROBE_POSITIONS; past that the last spacing found repeats (two or more
boundaries), as it does in every pattern seen. About 0.3-0.5 s; what it found is kept per
machine (host, CPU model and flags), ONNX Runtime version and head shape in
`gqa_buckets.json` at the root of Duet's cache folder (runtime/paths.py: $DUET_CACHE_DIR,
else $XDG_CACHE_HOME/duet or ~/.cache/duet), so a later process reads it instead of probing
again (a run of the ONNX target started half a second sooner); a file that cannot be read is
probed over.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from functools import cache
from pathlib import Path

import numpy as np

from runtime.paths import cache_root

PROBE_POSITIONS = 1024


def _gqa_session(heads: int, kv_heads: int, head_dim: int):
    import onnxruntime as ort
    from onnx import TensorProto as TP
    from onnx import helper as oh

    f = TP.FLOAT
    ins = [oh.make_tensor_value_info("q", f, ["b", "t", heads * head_dim]),
           oh.make_tensor_value_info("k", f, ["b", "t", kv_heads * head_dim]),
           oh.make_tensor_value_info("v", f, ["b", "t", kv_heads * head_dim]),
           oh.make_tensor_value_info("pk", f, ["b", kv_heads, "p", head_dim]),
           oh.make_tensor_value_info("pv", f, ["b", kv_heads, "p", head_dim]),
           oh.make_tensor_value_info("sl", TP.INT32, ["b"]),
           oh.make_tensor_value_info("tot", TP.INT32, []),
           oh.make_tensor_value_info("bias", f, ["b", 1, "t", "s"])]  # fmt: skip
    # with an attention_bias, as the target graph passes its mask (converters/onnx_target_graph)
    node = oh.make_node(
        "GroupQueryAttention",
        ["q", "k", "v", "pk", "pv", "sl", "tot", "", "", "", "bias"],
        ["o", "ok", "ov"],
        domain="com.microsoft",
        num_heads=heads,
        kv_num_heads=kv_heads,
        scale=head_dim**-0.5,
    )
    outs = [oh.make_tensor_value_info(n, f, None) for n in ("o", "ok", "ov")]
    model = oh.make_model(
        oh.make_graph([node], "gqa", ins, outs),
        opset_imports=[oh.make_opsetid("", 17), oh.make_opsetid("com.microsoft", 1)],
        ir_version=9,
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _store() -> Path:
    return cache_root() / "gqa_buckets.json"


def _machine_key(heads: int, kv_heads: int, head_dim: int) -> str:
    """What a probe's result holds for: this host and CPU (model and flags), ONNX Runtime's
    version, the head shape and the probe's reach."""
    import onnxruntime as ort

    cpu = ""
    try:  # Linux: the model name and every flag (the kernels ONNX Runtime dispatches to)
        cpu = "\n".join(
            line
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith(("model name", "flags"))
        )
    except OSError:
        cpu = platform.processor()
    ident = [platform.node(), platform.machine(), cpu, ort.__version__,
             heads, kv_heads, head_dim, PROBE_POSITIONS]  # fmt: skip
    return hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:24]


@cache
def key_cuts(heads: int, kv_heads: int, head_dim: int, upto: int = 1 << 16) -> tuple[int, ...]:
    """Positions c (increasing, < upto) before which a pass must be cut: no pass may hold both
    a row < c and a row >= c."""
    key, path = _machine_key(heads, kv_heads, head_dim), _store()
    try:
        found = json.loads(path.read_text())[key]
        if not (isinstance(found, list) and all(isinstance(c, int) for c in found)):
            raise ValueError(key)
    except (OSError, ValueError, KeyError, TypeError):
        found = _probe(heads, kv_heads, head_dim)
        _keep(path, key, found)
    cuts = list(found)
    if len(found) >= 2:  # the last spacing repeats past the probe
        step = found[-1] - found[-2]
        c = found[-1] + step
        while c < upto:
            cuts.append(c)
            c += step
    return tuple(c for c in cuts if c < upto)


def _keep(path: Path, key: str, found: list[int]) -> None:
    """Add this probe to the file, atomically; a cache that cannot be written is no error."""
    try:
        try:
            doc = json.loads(path.read_text())
            doc = doc if isinstance(doc, dict) else {}
        except (OSError, ValueError):
            doc = {}
        doc[key] = found
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, path)
    except OSError:
        pass


def _probe(heads: int, kv_heads: int, head_dim: int) -> list[int]:
    """The positions up to PROBE_POSITIONS before which this machine's GQA changes its sums."""
    s = _gqa_session(heads, kv_heads, head_dim)
    n = PROBE_POSITIONS + 4
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, n, heads * head_dim)).astype(np.float32)
    k = rng.standard_normal((1, n, kv_heads * head_dim)).astype(np.float32)
    v = rng.standard_normal((1, n, kv_heads * head_dim)).astype(np.float32)
    K = np.ascontiguousarray(k.reshape(1, n, kv_heads, head_dim).transpose(0, 2, 1, 3))
    V = np.ascontiguousarray(v.reshape(1, n, kv_heads, head_dim).transpose(0, 2, 1, 3))

    def row(p: int, T: int) -> np.ndarray:  # row p, first of a T-row pass over p keys
        tot = p + T
        feed = {"q": q[:, p : p + T], "k": k[:, p : p + T], "v": v[:, p : p + T],
                "pk": K[:, :, :p], "pv": V[:, :, :p], "sl": np.array([tot - 1], np.int32),
                "tot": np.array(tot, np.int32),
                "bias": np.zeros((1, 1, T, tot), np.float32)}  # fmt: skip
        return s.run(["o"], feed)[0][0, 0]

    return [p + 1 for p in range(1, PROBE_POSITIONS) if not np.array_equal(row(p, 2), row(p, 3))]
