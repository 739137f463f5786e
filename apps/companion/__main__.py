"""`python -m apps.companion package --draft DIR --out BUNDLE [--target DIR] [--profile NAME|FILE]
[--codec NAME]` builds a companion bundle; `python -m apps.companion run BUNDLE --prompt TEXT
[--server HOST:PORT --token-file F --link NAME]` generates through a cloud verifier with it
(without --server: drafts only). A tampered, truncated or incomplete bundle, or one the
verifier cannot verify, is refused with one line, exit 2."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from runtime.edge.codecs import CODEC_MODULES
from runtime.errors import DuetError, cli_main


def parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise DuetError(f"--prompt-ids takes comma-separated integers, got {text!r}") from None


@cli_main
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m apps.companion", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    add_package_parser(sub)
    add_run_parser(sub)
    args = ap.parse_args(argv)
    if args.cmd == "package":
        return run_package(args)
    from runtime.arg_rules import check_max_tokens

    check_max_tokens(args.max_tokens)
    ids = parse_ids(args.prompt_ids) if args.prompt_ids is not None else None
    if args.server is not None:
        return run_cloud(args, ids)
    if args.token_file or args.link != "none":
        raise DuetError("--token-file and --link need --server HOST:PORT")
    return run_local(args, ids)


def add_package_parser(sub) -> None:
    """`package`'s flags."""
    pk = sub.add_parser("package", help="build a bundle from a draft checkpoint")
    src = pk.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--draft", help="draft checkpoint directory (config.json, safetensors, tokenizer.json)"
    )
    src.add_argument(
        "--anchor",
        help="a FlexSpec anchor draft (python -m apps.train anchor): assembled from its base "
        "(--target, or the base it names) and recorded in the manifest with the base it "
        "anchors to",
    )
    pk.add_argument("--out", required=True, help="bundle directory to create")
    pk.add_argument(
        "--target", help="the target checkpoint it pairs with (checked: same vocabulary)"
    )
    pk.add_argument(
        "--max-context",
        type=int,
        help="draft context on the phone (default: the model's, at most 2048)",
    )
    pk.add_argument(
        "--prefill-len",
        type=int,
        default=16,
        help="query length of the prefill graphs (default 16)",
    )
    pk.add_argument("--onnx-quantize", default="none", choices=["none", "int8", "int16"])
    pk.add_argument(
        "--onnx-provider",
        default="qnn",
        choices=["qnn", "cpu", "cuda"],
        help="execution provider the ONNX draft is quantized for (default qnn: the phone's "
        "Hexagon NPU; cpu for ONNX Runtime's CPU provider; see "
        "`python -m converters export --help`)",
    )
    pk.add_argument(
        "--coreml-quantize", default="none", choices=["none", "int8", "int4", "palettize4"]
    )
    pk.add_argument(
        "--profile",
        help="device profile: a shipped name (python -m devices list) or a calibrated "
        ".toml/.json; its FlexSpec latency parameters drive K*",
    )
    pk.add_argument(
        "--codec",
        default="ids",
        help=f"VERIFY payload codec, a name in runtime/edge/codecs ({', '.join(CODEC_MODULES)}; "
        "default ids)",
    )
    pk.add_argument(
        "--no-coreml", action="store_true", help="ONNX only (Android): skip the Core ML package"
    )
    pk.add_argument("--json", action="store_true", help="print the manifest")


def add_run_parser(sub) -> None:
    """`run`'s flags."""
    rn = sub.add_parser("run", help="verify a bundle and draft greedily with it")
    rn.add_argument("bundle")
    g = rn.add_mutually_exclusive_group(required=True)
    g.add_argument("--prompt")
    g.add_argument("--prompt-ids", help="comma-separated token ids")
    rn.add_argument("--max-tokens", type=int, default=32)
    rn.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "onnx", "coreml"],
        help="auto: Core ML on macOS, ONNX Runtime elsewhere",
    )
    rn.add_argument(
        "--threads", type=int, default=1, help="ONNX Runtime intra-op threads (default 1)"
    )
    e = rn.add_argument_group("through a cloud verifier (python -m apps.cloud serve)")
    e.add_argument("--server", metavar="HOST:PORT", help="generate through this verifier")
    e.add_argument("--token-file", help="file holding the verifier's shared secret")
    e.add_argument("--link", default="none", help="emulated link: none, 5g, 4g, wifi-weak")
    e.add_argument("--link-seed", type=int, default=0)
    e.add_argument("--k", type=int, default=None, help="fixed K (default: K* per round)")
    e.add_argument("--k-max", type=int, default=8, help="bound on K* (default 8)")
    e.add_argument("--temp", type=float, default=0.0, help="0: greedy (default)")
    e.add_argument("--seed", type=int, default=0)
    rn.add_argument("--json", action="store_true")


def run_package(args: argparse.Namespace) -> int:
    """`package`: check the checkpoints, build the bundle, print its summary (or manifest)."""
    from runtime.preflight import check_checkpoint, check_pair_files

    anchor = None
    if args.anchor is not None:  # FlexSpec §IV-A: the phone keeps this draft as targets evolve
        from runtime.anchor import ANCHOR_RECORD, is_anchor_dir, materialize

        if not is_anchor_dir(args.anchor):
            raise DuetError(f"--anchor {args.anchor}: no {ANCHOR_RECORD} (not an anchor draft)")
        anchor = json.loads((Path(args.anchor) / ANCHOR_RECORD).read_text())
        args.draft = str(materialize(args.anchor, [Path(args.target)] if args.target else []))
    check_checkpoint(args.draft, "draft")  # before the converters import torch
    if args.target:
        check_checkpoint(args.target, "target")
        check_pair_files(args.target, args.draft)
    from apps.companion.package import package_bundle, summary

    m = package_bundle(
        args.draft,
        args.out,
        anchor=anchor,
        target=args.target,
        max_context=args.max_context,
        prefill_len=args.prefill_len,
        onnx_quantize=args.onnx_quantize,
        onnx_provider=args.onnx_provider,
        coreml_quantize=args.coreml_quantize,
        profile=args.profile,
        codec=args.codec,
        coreml=not args.no_coreml,
    )
    print(json.dumps(m, indent=2) if args.json else "\n".join(summary(m, Path(args.out))))
    return 0


def run_local(args: argparse.Namespace, ids: list[int] | None) -> int:
    """`run` without --server: draft with the bundle alone."""
    from apps.companion.client import run_bundle

    r = run_bundle(
        args.bundle,
        prompt=args.prompt,
        prompt_ids=ids,
        max_tokens=args.max_tokens,
        engine=args.engine,
        threads=args.threads,
    )
    return _report(r, args.json, _drafted_line)


def _drafted_line(r: dict) -> str:
    s = r["stats"]
    return (
        f"[{len(r['tokens'])} tokens drafted with {s['engine']} at {s['tokens_per_s']} tok/s; "
        f"bundle verified in {s['verify_s']:.3f} s]"
    )


def _report(r: dict, as_json: bool, notes) -> int:
    """A run's record as one JSON line, or its text on stdout and `notes(r)` on stderr."""
    if as_json:
        print(json.dumps(r))
    else:
        print(r["text"])
        print(notes(r), file=sys.stderr)
    return 0


def run_cloud(args: argparse.Namespace, ids: list[int] | None) -> int:
    """`run --server`: generate through the verifier; the text on stdout, rounds on stderr."""
    from apps.companion.cloud_client import round_lines, run_through_cloud

    if args.engine == "coreml":
        raise DuetError("run --server drafts with the bundle's ONNX graphs; drop --engine coreml")
    from runtime.decoding.flexspec import Options, check

    check(Options(k=args.k, k_max=args.k_max))  # K's bounds, as --method flexspec checks them
    r = run_through_cloud(
        args.bundle,
        server=args.server,
        token_file=args.token_file,
        prompt=args.prompt,
        prompt_ids=ids,
        max_tokens=args.max_tokens,
        link=args.link,
        link_seed=args.link_seed,
        k=args.k,
        k_max=args.k_max,
        temp=args.temp,
        seed=args.seed,
        threads=args.threads,
    )
    return _report(r, args.json, lambda r: "\n".join(round_lines(r["stats"])))


if __name__ == "__main__":
    sys.exit(main())
