"""`package`: convert a draft checkpoint into a companion bundle.

BUNDLE/
  draft.mlpackage/        Core ML, KV cache as state, prefill + decode (iOS 18 ANE)
  draft.onnx              static-shape decode graph (QNN and other NPU providers) ...
  draft.prefill.onnx      ... and its prefill graph
  genai_config.json       how to drive the two ONNX graphs
  tokenizer.json, config.json
  edge.json               wire version, codec + parameters, the HELLO claim (edge_side.py)
  profile.toml|.json      the device profile with FlexSpec's K* parameters (with --profile)
  manifest.json           identities, I/O names, parity, sha256 + size of every file
The bundle is built in a staging folder and moved into place only when complete.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tqdm import tqdm

from apps.companion.edge_side import load_k_profile, write_edge
from apps.companion.identity import base_identity, sha256_file, vocab_hash
from apps.companion.manifest import write_manifest
from runtime.config import ModelConfig
from runtime.errors import DuetError


def onnx_io(path: Path) -> dict:
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    dims = lambda v: [d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    return {
        "inputs": {v.name: dims(v) for v in g.input},
        "outputs": {v.name: dims(v) for v in g.output},
    }


def package_bundle(
    draft: str | Path,
    out: str | Path,
    *,
    target: str | Path | None = None,
    max_context: int | None = None,
    prefill_len: int = 16,
    onnx_quantize: str = "none",
    onnx_provider: str = "qnn",
    coreml_quantize: str = "none",
    profile: str | None = None,
    codec: str = "ids",
    coreml: bool = True,
    anchor: dict | None = None,
) -> dict:
    """Build the bundle at `out` from the checkpoint `draft`; returns the manifest.

    `profile` (a shipped name or a file) and `codec` (a name in CODEC_MODULES) go into
    edge.json; `target` adds the base identity a verifier checks at HELLO. `coreml=False`
    builds an ONNX-only bundle (Android). `anchor` is an anchor draft's record (anchor.json):
    the manifest keeps which base it anchors to (FlexSpec §IV-A)."""
    from runtime.edge.codecs import codec as codec_module

    src, out = Path(draft), Path(out)
    cfg = ModelConfig.from_dir(src)
    tok, pairs = check_pairing(src, cfg, target)
    codec_module(codec)  # an unknown codec or profile fails before any conversion
    prof = load_k_profile(profile) if profile else None
    if out.exists() and any(out.iterdir()):
        raise DuetError(f"{out}: exists and is not empty; remove it or choose another --out")
    ctx = int(max_context or min(cfg.max_context, 2048))
    recipe = {
        "onnx_quantize": onnx_quantize,
        "onnx_provider": onnx_provider,
        "coreml_quantize": coreml_quantize,
    }
    t0 = time.perf_counter()
    with staged(out) as staging, tqdm(total=3, desc="packaging", unit="step", leave=False) as bar:
        onnx_r, coreml_r, cm = convert(src, staging, bar, ctx, prefill_len, recipe, coreml)
        bar.set_postfix_str("manifest")
        shutil.copy2(tok, staging / "tokenizer.json")
        shutil.copy2(src / "config.json", staging / "config.json")
        edge = write_edge(
            staging,
            codec=codec,
            vocab=cfg.vocab_size,
            vocab_hash=pairs["vocab_hash"],
            base=pairs["base"],
            profile=prof,
        )
        body = {
            **model_section(src, cfg, tok, pairs["vocab_hash"]),
            "pairs_with": pairs,
            "anchor": anchor_section(anchor),
            "context_length": onnx_r["context"],
            "prefill_len": onnx_r["prefill_len"],
            "io": io_section(staging, cm),
            "edge": edge,
            "parity": {
                "onnx": onnx_r["parity"],
                "coreml": coreml_r["parity"] if coreml_r else None,
            },
            "conversion": conversion_section(onnx_r, coreml_r, recipe),
        }
        manifest = write_manifest(staging, body)
        bar.update()
    manifest["conversion"]["total_seconds"] = round(time.perf_counter() - t0, 2)
    return manifest


def check_pairing(src: Path, cfg: ModelConfig, target: str | Path | None) -> tuple[Path, dict]:
    """The draft's tokenizer.json and the manifest's `pairs_with`: the draft's family and
    vocabulary, and with `target` the target's, checked to be the same vocabulary."""
    tok = src / "tokenizer.json"
    if not tok.is_file():
        raise DuetError(
            f"{src}: no tokenizer.json; a bundle ships the tokenizer the draft was trained with"
        )
    vhash = vocab_hash(tok)
    pairs = {"family": cfg.model_type, "vocab_hash": vhash, "vocab_size": cfg.vocab_size,
             "base": None}  # fmt: skip
    if target is None:
        return tok, pairs
    tcfg = ModelConfig.from_dir(target)
    ttok = Path(target) / "tokenizer.json"
    tvh = vocab_hash(ttok) if ttok.is_file() else None
    if tvh != vhash or tcfg.vocab_size != cfg.vocab_size:
        raise DuetError(
            f"{target}: its vocabulary differs from the draft's ({src}); they cannot pair"
        )
    pairs.update(
        family=tcfg.model_type,
        target=Path(target).name,
        target_layers=tcfg.num_layers,
        base=base_identity(target),  # the verifier refuses a bundle built for another base
    )
    return tok, pairs


@contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A staging folder beside `out`, moved into place only when the block completes and
    removed when it fails."""
    staging = out.with_name(out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if out.exists():
        out.rmdir()
    staging.rename(out)


def convert(
    src: Path, staging: Path, bar, ctx: int, prefill_len: int, recipe: dict, coreml: bool
) -> tuple[dict, dict | None, dict | None]:
    """The static ONNX graphs, then (with `coreml`) the Core ML package; returns their
    conversion records and the Core ML package's description (None for ONNX only)."""
    from converters.coreml_export import export_coreml
    from converters.onnx_static_build import build_static_onnx
    from runtime.backends.coreml.spec import describe

    bar.set_postfix_str("onnx (static)")
    onnx_r = build_static_onnx(
        src,
        staging / "draft.onnx",
        context=ctx,
        prefill_len=prefill_len,
        quantization=recipe["onnx_quantize"],
        provider=recipe["onnx_provider"],
    )
    bar.update()
    bar.set_postfix_str("core ml")
    coreml_r = cm = None
    if coreml:
        coreml_r = export_coreml(
            src,
            staging / "draft.mlpackage",
            max_context=ctx,
            prefill_len=prefill_len,
            compression=recipe["coreml_quantize"],
        )
        cm = describe(staging / "draft.mlpackage")
    bar.update()
    return onnx_r, coreml_r, cm


def model_section(src: Path, cfg: ModelConfig, tok: Path, vhash: str) -> dict:
    """The manifest's `model` and `tokenizer` entries."""
    return {
        "model": {
            "name": src.resolve().name,
            "model_type": cfg.model_type,
            "num_layers": cfg.num_layers,
            "hidden_size": cfg.hidden_size,
            "vocab_size": cfg.vocab_size,
            "config_sha256": sha256_file(src / "config.json"),
            "eos_token_ids": list(cfg.eos_token_ids),
        },
        "tokenizer": {"file": "tokenizer.json", "sha256": sha256_file(tok), "vocab_hash": vhash},
    }


def anchor_section(anchor: dict | None) -> dict | None:
    """The manifest's `anchor`: the base an anchor draft anchors to (FlexSpec §IV-A)."""
    if anchor is None:
        return None
    return {
        "anchors_to": anchor["base"],
        "anchor_layer": anchor.get("anchor_layer"),
        "kind": anchor.get("kind"),
    }


def io_section(staging: Path, cm: dict | None) -> dict:
    """The manifest's `io`: the graphs' input and output names and shapes."""
    return {
        "onnx": {
            "decode": onnx_io(staging / "draft.onnx"),
            "prefill": onnx_io(staging / "draft.prefill.onnx"),
            "genai_config": "genai_config.json",
        },
        "coreml": {
            "package": "draft.mlpackage",
            "default_function": cm["default_function"],
            "functions": cm["functions"],
        }
        if cm
        else None,  # an ONNX-only bundle
    }


def conversion_section(onnx_r: dict, coreml_r: dict | None, recipe: dict) -> dict:
    """The manifest's `conversion`: how each format was made, in what time and size."""
    return {
        "onnx": {
            "quantization": recipe["onnx_quantize"],
            # the recipe the int8/int16 graph was made with, and the provider it is for
            "recipe": onnx_r.get("quantize", {"scheme": "none"})
            | {"provider": recipe["onnx_provider"]},
            "seconds": onnx_r["convert_s"],
            "bytes": onnx_r["size_bytes"],
        },
        "coreml": {
            "compression": recipe["coreml_quantize"],
            "seconds": coreml_r["convert_s"],
            "bytes": coreml_r["size_bytes"],
        }
        if coreml_r
        else None,
    }


def summary(manifest: dict, out: Path) -> list[str]:
    """Lines the command prints after packaging."""
    size = sum(e["size"] for e in manifest["files"].values())
    po, pc = manifest["parity"]["onnx"], manifest["parity"]["coreml"]
    edge, model, pairs = manifest["edge"], manifest["model"], manifest["pairs_with"]
    prof = edge["profile"]
    lines = [
        f"wrote {out}: {len(manifest['files'])} files, {size / 1e6:.2f} MB, "
        f"in {manifest['conversion']['total_seconds']:.1f} s",
        f"draft {model['name']} ({model['model_type']}), context {manifest['context_length']}, "
        f"pairs with a {pairs['family']} target of vocabulary {pairs['vocab_hash'][:12]}",
        f"onnx parity: max |Δlogit| {po['max_abs']:.2e}, top-1 {po['top1_agree']:.3f} "
        f"({'ok' if po['ok'] else 'FAIL'})",
        f"edge: wire v{edge['wire_version']}, codec {edge['codec']['name']}, profile "
        + (f"{prof['name']} (alpha_edge {prof['flexspec']['alpha_edge'] * 1e3:.2f} ms/token)"
           if prof else "none (K* fitted online)")
        + (f", base {pairs['base']['name']}" if pairs["base"]
           else ", no base (package with --target to pin one)"),
    ]  # fmt: skip
    if manifest.get("anchor"):
        a = manifest["anchor"]["anchors_to"]
        lines.append(
            f"anchor draft: frozen block {manifest['anchor']['anchor_layer']} of the "
            f"{a['model_type']} base with weights sha256 "
            f"{a['base_sha256'][:12]}"
        )
    if pc is not None:
        lines.append(
            f"coreml parity (traced module): fp16 max rel {pc['fp16']['max_rel_err']:.1e} "
            f"({'ok' if pc['fp16']['ok'] else 'FAIL'})"
        )
    return lines
