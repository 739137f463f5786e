"""`python -m converters export --model DIR --format coreml|onnx|mlx --out PATH`.

  onnx    dynamic-shape export (the desktop/CPU draft; a hybrid qwen3_5_text draft as a
          one-token graph with its states as I/O); --out DIR (not ending in .onnx)
          writes an ONNX Runtime GenAI folder (model.onnx, genai_config.json, tokenizer
          files) that onnxruntime_genai.Model(DIR) loads as is; with --static-shapes, fixed
          query length and --max-context as QNN needs, optionally --quantize int8|int16
          (QDQ) for --provider cpu|qnn|cuda, and genai_config.json beside it

Which --provider to quantize for: the execution provider the artefact will run on.
  cpu   (default) ONNX Runtime's CPU provider on any x86-64 or arm64: int8 with 7-bit
        (reduce-range) weights, because the U8S8 kernel on x86-64 CPUs without VNNI
        (AVX2-only, e.g. AMD EPYC before Zen 4) sums products in a saturating int16
  qnn   Snapdragon Hexagon HTP: full-range uint8 activations x int8 weights
  cuda  NVIDIA (CUDA/TensorRT): full-range int8 x int8
The choice is recorded in the graphs' metadata (duet.quantization). Parity runs on that
provider when ONNX Runtime has it here; otherwise the CPU stands in and the report names
the CPU's int8 path. A qnn artefact loaded on a CPU without VNNI runs its QDQ graph
unfused (exact, slower) rather than through the clipping int8 kernel.
  coreml  an iOS 18 / macOS 15 .mlpackage with the KV cache as state (prefill + decode
          functions sharing weights); --quantize int8|int4|palettize4; --kv-io for the
          explicit KV-in/KV-out fallback
  mlx     the target quantized with mlx-lm (--quantize 4|8, default 4)
  onnx --role target  the ONNX Runtime target's graphs (converters/onnx_target_export.py):
          --quantize int4|int8|none (block-wise MatMulNBits), --exit-layer E for Mirror-SD's
          split parts, --out DIR (CHECKPOINT/.duet is where --target-backend onnx looks)

Every export prints the parity it measured against its reference with the named
tolerance, keeps it in the artefact's metadata, and exits non-zero when parity
is past the tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys

from runtime.cli_parser import doc_parser
from runtime.errors import DuetError, cli_main

QUANTIZE = {
    "onnx": ("none", "int8", "int16"),
    "coreml": ("none", "int8", "int4", "palettize4"),
    "mlx": ("4", "8"),
}


def export_onnx_checked(model: str, out: str, tol: float) -> dict:
    """The dynamic-shape export with parity against the PyTorch reference, kept in its metadata."""
    from converters.onnx_export import export_onnx
    from converters.onnx_static import set_metadata
    from converters.parity import decode_parity
    from runtime.backends.onnx import load_onnx_lm
    from runtime.backends.torch.causal_lm import TorchCausalLM
    from runtime.drafts.ss.checkpoint import is_ss_dir

    if is_ss_dir(model):  # a speculative-streaming draft: its own graph (main + streams)
        from converters.onnx_ss_export import export_ss_onnx
        from runtime.drafts.ss.onnx import OnnxSSCausalLM
        from runtime.drafts.ss.torch import SSCausalLM

        ref = SSCausalLM.load(model)
        info = export_ss_onnx(model, out)
        par = decode_parity(ref, OnnxSSCausalLM.load(out))  # the main stream's parity
        info.update(parity=par, tolerance=tol, ok=par["max_abs"] <= tol)
        return info
    ref = TorchCausalLM.load(model)  # validates the checkpoint before the export starts
    info = export_onnx(model, out)
    # a hybrid's prompt runs through its prefill graph in chunks: cover two and the tail
    n = 40 if ref.config.is_hybrid else 16
    par = decode_parity(ref, load_onnx_lm(out, config_dir=model), prompt_len=n)
    info.update(parity=par, tolerance=tol, ok=par["max_abs"] <= tol)
    set_metadata(out, {"duet.parity": {**par, "tolerance": {"max_abs": tol}, "ok": info["ok"]}})
    return info


def run_export(args) -> dict:
    """Dispatch one export; returns a report with `ok`, `summary` lines and the details."""
    q = args.quantize or ("4" if args.format == "mlx" else "none")
    if q not in QUANTIZE[args.format]:
        raise DuetError(
            f"--quantize {q} does not apply to --format {args.format}; "
            f"choose from {', '.join(QUANTIZE[args.format])}"
        )
    if args.format == "onnx" and not args.static_shapes:
        if q != "none" or args.max_context:
            raise DuetError("--quantize and --max-context need --static-shapes for --format onnx")
        from converters.parity import ONNX_FP32_TOL

        tol = args.tol if args.tol is not None else ONNX_FP32_TOL
        folder = None
        if not args.out.endswith(".onnx"):  # an ONNX Runtime GenAI folder
            from converters.onnx_genai import MODEL_FILE, finish_folder, prepare_folder

            folder, cfg = prepare_folder(args.model, args.out)
            info = export_onnx_checked(args.model, str(folder / MODEL_FILE), tol)
            info.update(finish_folder(args.model, folder, cfg))
        else:
            info = export_onnx_checked(args.model, args.out, tol)
        p = info["parity"]
        info["summary"] = [
            f"wrote {info['path']} ({info['bytes'] / 1e6:.2f} MB) in {info['seconds']:.1f} s",
            f"parity vs PyTorch reference: max |Δlogit| prefill {p['prefill_max_abs']:.2e}, "
            f"decode {p['decode_max_abs']:.2e} (tolerance {tol:.0e}); "
            f"top-1 agreement {p['top1_agree']:.3f}",
        ]
        if folder is not None:
            info["summary"].append(f"wrote {info['genai_config']} and {', '.join(info['copied'])}")
        return info
    if args.format == "onnx":
        from converters.onnx_static_build import build_static_onnx

        r = build_static_onnx(
            args.model,
            args.out,
            context=args.max_context,
            prefill_len=args.prefill_len,
            quantization=q,
            provider=args.provider,
        )
        p = r["parity"]
        r["ok"] = p["ok"]
        r["summary"] = [
            f"wrote {r['paths']['decode']} + {r['paths']['prefill']} "
            f"(static: context {r['context']}, prefill {r['prefill_len']}; {q}) "
            f"{r['size_bytes'] / 1e6:.2f} MB in {r['convert_s']:.1f} s",
            f"parity vs PyTorch reference: max |Δlogit| {p['max_abs']:.2e}, top-1 agreement "
            f"{p['top1_agree']:.3f} (tolerance {p['tolerance']}) -> {'ok' if p['ok'] else 'FAIL'}",
            f"measured on {p['measured_on']} ({p['kernels']})"
            + (f"; {p['stand_in']}" if "stand_in" in p else "")
            + (f"; CPU int8 path: {p['cpu_int8_path']}" if "cpu_int8_path" in p else ""),
            f"wrote {r['genai_config']}",
        ]
        return r
    if args.format == "coreml":
        from converters.coreml_export import export_coreml

        r = export_coreml(
            args.model,
            args.out,
            max_context=args.max_context,
            prefill_len=args.prefill_len,
            flavour="kvio" if args.kv_io else "stateful",
            compression=q,
        )
        p = r["parity"]
        r["ok"] = p["fp32"]["ok"] and p["fp16"]["ok"]
        r["summary"] = [
            f"wrote {args.out} ({r['flavour']} KV cache, context {r['context']}, "
            f"prefill {r['prefill_len']}, "
            f"weights {q}) {r['size_bytes'] / 1e6:.2f} MB in {r['convert_s']:.1f} s",
            "parity of the traced ANE module vs transformers: "
            + ", ".join(
                f"{k} max rel {p[k]['max_rel_err']:.1e} (tol {p[k]['tolerance']:.0e})"
                for k in ("fp32", "fp16")
            )
            + f"; top-1 {p['fp16']['top1_agree']:.3f}",
            "prediction parity of the package itself runs on macOS (tests/test_convert_coreml.py)",
        ]
        return r
    from converters.mlx_quantize import quantize_mlx

    r = quantize_mlx(args.model, args.out, bits=int(q), group_size=args.group_size)
    p = r["parity"]
    r["ok"] = p["ok"]
    r["summary"] = [
        f"wrote {args.out} ({q}-bit, group {r['group_size']}) {r['size_bytes'] / 1e6:.2f} MB "
        f"(from {r['source_size_bytes'] / 1e6:.2f} MB) in {r['convert_s']:.1f} s",
        f"parity vs full precision on {p['prompts']} held-out prompts "
        f"({p['positions']} positions): top-1 agreement {p['top1_agree']:.3f}, "
        f"mean KL {p['mean_kl']:.2e} (tolerance {p['tolerance']})",
    ]
    return r


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = doc_parser("python -m converters", __doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser(
        "export",
        help="convert a checkpoint for a device runtime",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ex.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    ex.add_argument("--format", required=True, choices=sorted(QUANTIZE), help="artefact format")
    ex.add_argument(
        "--out",
        required=True,
        help="output path (draft.onnx; a directory for an onnx GenAI folder or mlx; "
        "draft.mlpackage)",
    )
    ex.add_argument(
        "--quantize", help="onnx: int8|int16 (static only); coreml: int8|int4|palettize4; mlx: 4|8"
    )
    ex.add_argument(
        "--provider",
        default="cpu",
        choices=["cpu", "qnn", "cuda"],
        help="onnx --quantize: the execution provider the artefact is for (default cpu; see above)",
    )
    ex.add_argument(
        "--max-context",
        type=int,
        help="cache length for static/Core ML graphs (default: the model's)",
    )
    ex.add_argument(
        "--static-shapes", action="store_true", help="onnx: fixed query length and context (QNN)"
    )
    ex.add_argument(
        "--prefill-len", type=int, default=16, help="query length of the prefill graph (default 16)"
    )
    ex.add_argument(
        "--kv-io", action="store_true", help="coreml: KV cache as inputs/outputs instead of state"
    )
    ex.add_argument(
        "--group-size", type=int, default=64, help="mlx: quantization group size (default 64)"
    )
    ex.add_argument("--tol", type=float, default=None, help="onnx (dynamic): max |Δlogit| allowed")
    ex.add_argument(
        "--role",
        choices=["draft", "target"],
        default="draft",
        help="onnx: target = the ONNX Runtime target's graphs (--out DIR; --quantize "
        "int4|int8|none, default int4; --exit-layer E adds Mirror-SD's split parts); "
        "--out CHECKPOINT/.duet is where --target-backend onnx looks "
        "(default draft)",
    )
    ex.add_argument(
        "--exit-layer",
        type=int,
        default=None,
        help="--role target: also export the parts split at this layer",
    )
    ex.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)
    if args.max_context is not None and args.max_context < 2:
        raise DuetError(f"--max-context must be at least 2, not {args.max_context}")

    from runtime.preflight import check_checkpoint, writable_file

    check_checkpoint(args.model, "model")  # before torch is imported
    if args.role == "target":  # converters/onnx_target_export.py
        from converters.onnx_target_cli import export_target_cli

        return export_target_cli(args)
    if args.out.endswith(".onnx") or args.format == "coreml":
        writable_file(args.out, "--out")
    info = run_export(args)
    summary = info.pop("summary")
    print(json.dumps(info, indent=2, default=str) if args.json else "\n".join(summary))
    if not info["ok"]:
        raise DuetError(f"parity exceeds tolerance ({summary[1]}); the artefact is kept")
    return 0


if __name__ == "__main__":
    sys.exit(main())
