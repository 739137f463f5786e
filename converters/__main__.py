"""`python -m converters export --model DIR --format onnx --out PATH`.

Exports a checkpoint and prints the parity it measured against the PyTorch
reference; exits non-zero when parity is past its named tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys

from runtime.errors import DuetError, cli_main


def export_onnx_checked(model: str, out: str, tol: float) -> dict:
    from converters.onnx_export import export_onnx
    from converters.parity import decode_parity
    from runtime.backends.onnx_backend import OnnxCausalLM
    from runtime.backends.torch_backend import TorchCausalLM

    ref = TorchCausalLM.load(model)  # validates the checkpoint before the export starts
    info = export_onnx(model, out)
    par = decode_parity(ref, OnnxCausalLM.load(out, config_dir=model))
    info.update(parity=par, tolerance=tol, ok=par["max_abs"] <= tol)
    return info


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m converters",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = ap.add_subparsers(dest="cmd", required=True)
    ex = sub.add_parser("export", help="convert a checkpoint for a device runtime")
    ex.add_argument("--model", required=True, help="Hugging Face checkpoint directory")
    ex.add_argument("--format", required=True, choices=["onnx"], help="artefact format")
    ex.add_argument("--out", required=True, help="output path (e.g. draft.onnx)")
    ex.add_argument(
        "--tol",
        type=float,
        default=None,
        help="max |Δlogit| allowed (default: the format's named tolerance)",
    )
    ex.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args(argv)

    from converters.parity import ONNX_FP32_TOL

    info = export_onnx_checked(
        args.model, args.out, args.tol if args.tol is not None else ONNX_FP32_TOL
    )
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        p = info["parity"]
        print(f"wrote {info['path']} ({info['bytes'] / 1e6:.2f} MB) in {info['seconds']:.1f} s")
        print(
            f"parity vs PyTorch reference: max |Δlogit| prefill {p['prefill_max_abs']:.2e}, "
            f"decode {p['decode_max_abs']:.2e} (tolerance {info['tolerance']:.0e}); top-1 agreement {p['top1_agree']:.3f}"
        )
    if not info["ok"]:
        raise DuetError(
            f"parity {info['parity']['max_abs']:.3e} exceeds tolerance {info['tolerance']:.1e}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
