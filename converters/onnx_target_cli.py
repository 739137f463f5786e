"""`python -m converters export --role target`: the ONNX Runtime target's graphs, ahead of time.

Writes the parts converters/onnx_target_export.py builds, under the names the runtime caches
them by, and prints each part's parity against the PyTorch reference on a short token sequence
(max |Δlogit| and top-1 agreement); a float32 build (--quantize none) must stay within --tol.

`python -m converters.onnx_target_cli agree --model M --quantize int4 --text FILE`: top-1
agreement with float32 on held-out text (converters/onnx_target_agree.py).
`python -m converters.onnx_target_cli pass-cost --model M --quantize int4`: the seconds of a
w-token verify pass over a context, per window, and their ratios (converters/onnx_target_bench.py).
"""

from __future__ import annotations

import argparse
import json
import sys
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
        print(
            f"parity vs PyTorch float32: max |Δlogit| {parity['max_abs_logit_diff']:.2e}, "
            f"top-1 agreement {parity['top1']:.3f} over "
            f"{parity['positions']} positions"
        )
    if not ok:
        raise DuetError(f"float32 parity {parity['max_abs_logit_diff']:.2e} exceeds {tol}")
    return 0


def _parity(model: str, out: Path, q: str) -> dict:
    import shutil
    import tempfile

    from runtime.backends.onnx.target import OnnxTargetLM, part_path
    from runtime.backends.torch.causal_lm import TorchCausalLM
    from runtime.paths import sidecar

    ref = TorchCausalLM.load(model)
    n = min(64, ref.config.vocab_size)
    ids = np.random.default_rng(0).integers(0, ref.config.vocab_size, (1, n))
    with tempfile.TemporaryDirectory() as tmp:  # open what was written, not the live cache
        cache = sidecar(tmp)  # the layout OnnxTargetLM reads
        cache.mkdir()
        full = part_path(Path(model), q, "full").name
        shutil.copy(out / full, cache / full)
        for f in Path(model).iterdir():
            if f.suffix == ".json":
                shutil.copy(f, Path(tmp) / f.name)
        lm = OnnxTargetLM(tmp, q, intra_threads=1)
        a = lm.forward(ids, lm.new_cache())
    r = ref.forward(ids, ref.new_cache())
    return {
        "max_abs_logit_diff": float(np.abs(a - r).max()),
        "top1": float((a.argmax(-1) == r.argmax(-1)).mean()),
        "positions": n,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m converters.onnx_target_cli",
        description="Measurements of the ONNX Runtime target.",
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    ag = sub.add_parser("agree", help="top-1 agreement with float32 on held-out text")
    ag.add_argument("--model", required=True, help="checkpoint dir or a known model's name")
    ag.add_argument("--quantize", default="int4", help="int4 | int8 | none")
    ag.add_argument(
        "--text", required=True, help=".jsonl (turns/reference/text fields) or a plain text file"
    )
    ag.add_argument("--positions", type=int, default=2048, help="positions to compare")
    ag.add_argument("--per-text", type=int, default=256, help="tokens read from each text")
    ag.add_argument("--threads", type=int, default=2)
    ag.add_argument(
        "--ort-genai",
        metavar="DIR",
        default=None,
        help="measure this onnxruntime-genai model folder (the bench's peer, "
        "~/.cache/duet/ort-genai/NAME-int4) instead of Duet's target",
    )
    ag.add_argument("--json", action="store_true")
    pc = sub.add_parser("pass-cost", help="seconds of a w-token pass over a context, per w")
    pc.add_argument("--model", required=True, help="checkpoint dir or a known model's name")
    pc.add_argument("--quantize", default="int4", help="int4 | int8 | none")
    pc.add_argument("--context", type=int, default=200, help="tokens already in the cache")
    pc.add_argument("--windows", default="1,5", help="window lengths, comma-separated")
    pc.add_argument("--repeats", type=int, default=30)
    pc.add_argument("--threads", type=int, default=2)
    pc.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        from runtime.loading import resolve

        model = resolve(args.model, "model")
        if args.cmd == "agree":
            from converters.onnx_target_agree import read_texts, top1_agreement

            r = top1_agreement(
                model,
                args.quantize,
                read_texts(args.text),
                positions=args.positions,
                per_text=args.per_text,
                threads=args.threads,
                genai_dir=args.ort_genai,
            )
            r["text"] = args.text
            print(
                json.dumps(r)
                if args.json
                else f"{r['quantize']} vs float32 on {args.text}: top-1 agreement "
                f"{r['agreement']:.3f} over {r['positions']} positions "
                f"({r['texts']} texts, {r['seconds']:.0f} s)"
            )
        else:
            from converters.onnx_target_bench import pass_costs

            try:
                windows = tuple(int(w) for w in args.windows.split(","))
            except ValueError:
                raise DuetError(f"--windows {args.windows!r}: expected integers like 1,5") from None
            r = pass_costs(
                model,
                args.quantize,
                context=args.context,
                windows=windows,
                repeats=args.repeats,
                threads=args.threads,
            )
            print(
                json.dumps(r)
                if args.json
                else "\n".join(
                    f"{w:>3} tokens over {args.context}: {s * 1e3:7.2f} ms ({r['ratio'][w]:.2f}x), "
                    f"CPU {r['cpu_seconds'][w] * 1e3:7.2f} ms ({r['cpu_ratio'][w]:.2f}x)"
                    for w, s in r["seconds"].items()
                )
            )
    except DuetError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # the converters package, imported first, registers the exporter
    sys.exit(main())
