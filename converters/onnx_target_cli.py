"""`python -m converters export --role target`: the ONNX Runtime target's graphs, ahead of time.

Writes the parts converters/onnx_target_export.py builds, under the names the runtime caches
them by, and prints each part's parity against the PyTorch reference on a short token sequence
(max |Δlogit| and top-1 agreement); a float32 build (--quantize none) must stay within --tol.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from runtime.errors import DuetError

FLOAT_TOL = 1e-3  # float32 graph vs the reference: max |Δlogit|


def export_target_cli(args) -> int:
    from converters.onnx_target_export import QUANTIZE, export_target

    if args.format != "onnx":
        raise DuetError("--role target exports ONNX graphs: add --format onnx")
    q = args.quantize or "int4"
    if q not in QUANTIZE:
        raise DuetError(f"--role target: --quantize is one of {', '.join(QUANTIZE)} (got {q})")
    out = Path(args.out)
    if out.suffix == ".onnx":
        raise DuetError("--role target writes several graphs: --out is a directory")
    done = export_target(args.model, out, q, args.exit_layer)
    parity = _parity(args.model, out, q)
    tol = args.tol if args.tol is not None else FLOAT_TOL
    ok = q != "none" or parity["max_abs_logit_diff"] <= tol
    info = {"ok": ok, "parts": done, "parity": parity}
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        for d in done:
            print(f"wrote {d['path']} ({d['bytes'] / 1e6:.1f} MB, {d['seconds']:.1f} s)")
        print(f"parity vs PyTorch float32: max |Δlogit| {parity['max_abs_logit_diff']:.2e}, "
              f"top-1 agreement {parity['top1']:.3f} over {parity['positions']} positions")  # fmt: skip
    if not ok:
        raise DuetError(f"float32 parity {parity['max_abs_logit_diff']:.2e} exceeds {tol}")
    return 0


def _parity(model: str, out: Path, q: str) -> dict:
    import shutil
    import tempfile

    from runtime.backends.onnx_target import OnnxTargetLM, part_path
    from runtime.backends.torch_backend import TorchCausalLM

    ref = TorchCausalLM.load(model)
    n = min(64, ref.config.vocab_size)
    ids = np.random.default_rng(0).integers(0, ref.config.vocab_size, (1, n))
    with tempfile.TemporaryDirectory() as tmp:  # open what was written, not the live cache
        cache = Path(tmp) / ".duet"
        cache.mkdir()
        full = part_path(Path(model), q, "full").name
        shutil.copy(out / full, cache / full)
        for f in Path(model).iterdir():
            if f.suffix == ".json":
                shutil.copy(f, Path(tmp) / f.name)
        lm = OnnxTargetLM(tmp, q, intra_threads=1)
        a = lm.forward(ids, lm.new_cache())
    r = ref.forward(ids, ref.new_cache())
    return {"max_abs_logit_diff": float(np.abs(a - r).max()),
            "top1": float((a.argmax(-1) == r.argmax(-1)).mean()), "positions": n}  # fmt: skip
