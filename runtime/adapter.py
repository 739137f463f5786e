"""LoRA adapters in PEFT's format, checked against their base and merged into it at load.

An adapter directory holds PEFT's `adapter_config.json` + `adapter_model.safetensors` and our
`duet_base.json`, written at training time: the base's model type, shapes and the SHA-256 of its
weight files. `merged_target_dir` refuses an adapter whose base differs (one DuetError line),
then writes the merged checkpoint once, W' = W + (alpha / r) * B @ A per adapted linear layer
(float32, so the sum is not rounded again), under `ADAPTER/.duet/merged-<base hash>/`, the way
runtime.backends caches an ONNX export. Every backend then loads an ordinary directory, so the
merge costs nothing per token and MLX, PyTorch and ONNX see the same weights.

The formula is PEFT's own LoRA merge for `nn.Linear` (LoraLayer.get_delta_weight); we apply it
from the saved tensors rather than importing peft so that the runtime does not depend on it.
What it does not do: DoRA, rank/alpha patterns, bias training or modules_to_save (refused),
quantized (MLX-format) bases (refused). Several adapters over one loaded backbone, each a view
sharing the base's untouched tensors (the cloud verifier's), are runtime/adapter_views.py.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from runtime.errors import DuetError
from runtime.paths import is_stale, sidecar

BASE_RECORD = "duet_base.json"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def base_fingerprint(base_dir: str | Path) -> str:
    """SHA-256 over the base's *.safetensors files (sorted by name, contents only)."""
    files = sorted(Path(base_dir).glob("*.safetensors"))
    if not files:
        raise DuetError(f"{base_dir}: no *.safetensors weights to fingerprint")
    h = hashlib.sha256()
    for f in files:
        with f.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()


def base_record(base_dir: str | Path) -> dict:
    """What an adapter (or anchor draft) records about the base it was trained on."""
    cfg = json.loads((Path(base_dir) / "config.json").read_text())
    keys = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")
    return {"base_sha256": base_fingerprint(base_dir), **{k: cfg.get(k) for k in keys}}


def write_base_record(out_dir: str | Path, base_dir: str | Path) -> dict:
    rec = base_record(base_dir)
    (Path(out_dir) / BASE_RECORD).write_text(json.dumps(rec, indent=2) + "\n")
    return rec


def _base_tensors(base_dir: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(base_dir.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _lora_pairs(adapter: dict) -> dict[str, tuple]:
    """{base weight name: (A (r, in), B (out, r))} from PEFT's saved key names."""
    pairs: dict[str, list] = {}
    for k, v in adapter.items():
        for part, i in ((".lora_A.weight", 0), (".lora_B.weight", 1)):
            if k.endswith(part):
                name = k[: -len(part)].removeprefix("base_model.model.") + ".weight"
                pairs.setdefault(name, [None, None])[i] = v
    bad = [n for n, (a, b) in pairs.items() if a is None or b is None]
    if bad or not pairs:
        raise DuetError(f"adapter: no complete lora_A/lora_B pairs (incomplete: {bad[:3]})")
    return {n: (a, b) for n, (a, b) in pairs.items()}


def check_adapter(adapter_dir: str | Path, base_dir: str | Path) -> tuple[dict, dict]:
    """Refuse (DuetError) an adapter that is not for this base; return (config, lora pairs)."""
    from safetensors.torch import load_file

    a, base = Path(adapter_dir), Path(base_dir)
    missing = [f for f in (*ADAPTER_FILES, BASE_RECORD) if not (a / f).is_file()]
    if missing:
        raise DuetError(f"--adapter {a}: missing {', '.join(missing)} (not a Duet/PEFT adapter)")
    cfg = json.loads((a / "adapter_config.json").read_text())
    if cfg.get("peft_type") != "LORA":
        raise DuetError(
            f"--adapter {a}: peft_type {cfg.get('peft_type')!r}; only LORA is supported"
        )
    unsupported = [
        k for k in ("use_dora", "rank_pattern", "alpha_pattern", "modules_to_save") if cfg.get(k)
    ] + ([f"bias={cfg['bias']}"] if cfg.get("bias", "none") != "none" else [])
    if unsupported:
        raise DuetError(f"--adapter {a}: unsupported LoRA options {', '.join(unsupported)}")
    if (base / "config.json").is_file() and "quantization" in json.loads(
        (base / "config.json").read_text()
    ):
        raise DuetError(f"--adapter: target {base} is quantized; merge needs float weights")
    rec = json.loads((a / BASE_RECORD).read_text())
    mine = base_record(base)
    for k in ("model_type", "hidden_size", "num_hidden_layers", "vocab_size"):
        if rec.get(k) != mine.get(k):
            raise DuetError(
                f"--adapter {a} was trained on a {k}={rec.get(k)} base; "
                f"--target {base} has {k}={mine.get(k)}"
            )
    if rec.get("base_sha256") != mine["base_sha256"]:
        raise DuetError(
            f"--adapter {a} was trained on another base (weights sha256 "
            f"{str(rec.get('base_sha256'))[:12]}...); --target {base} is "
            f"{mine['base_sha256'][:12]}..."
        )
    pairs = _lora_pairs(load_file(str(a / "adapter_model.safetensors")))
    return cfg, pairs


def lora_scale(cfg: dict) -> float:
    """PEFT's LoRA scaling s: alpha / r, or alpha / sqrt(r) with rsLoRA."""
    r, alpha = cfg["r"], cfg["lora_alpha"]
    return alpha / r**0.5 if cfg.get("use_rslora") else alpha / r


def merged_weight(name: str, W, A, B, scale: float, adapter_dir) -> object:
    """W + s * B @ A in float32 (torch tensors); one line when the shapes do not fit."""
    if tuple(W.shape) != (B.shape[0], A.shape[1]):
        raise DuetError(
            f"--adapter {adapter_dir}: {name} is {tuple(W.shape)} in the base, "
            f"the adapter's B @ A is {(B.shape[0], A.shape[1])}"
        )
    return W.float() + scale * (B.float() @ A.float())  # W' = W + (alpha/r) B A


def merged_state(base_dir: str | Path, adapter_dir: str | Path) -> dict:
    """The base's tensors with every adapted weight replaced by W + s * B @ A (float32)."""
    cfg, pairs = check_adapter(adapter_dir, base_dir)
    scale = lora_scale(cfg)
    state = _base_tensors(Path(base_dir))
    for name, (A, B) in pairs.items():
        if name not in state:
            raise DuetError(f"--adapter {adapter_dir}: adapts {name}, which the base lacks")
        state[name] = merged_weight(name, state[name], A, B, scale, adapter_dir)
    return {k: v.float().contiguous() for k, v in state.items()}


def merged_target_dir(base_dir: str | Path, adapter_dir: str | Path) -> Path:
    """A checkpoint directory of base + adapter merged, written once and reused."""
    from safetensors.torch import save_file

    base, a = Path(base_dir), Path(adapter_dir)
    if not a.is_dir():
        raise DuetError(f"--adapter {a}: no such directory")
    out = sidecar(a, f"merged-{base_fingerprint(base)[:16]}")
    if not is_stale(out / "merged_from.json", [a / "adapter_model.safetensors"]):
        return out
    state = merged_state(base, a)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in base.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and not f.name.endswith(".onnx"):
            shutil.copy(f, tmp / f.name)
    cfg = json.loads((base / "config.json").read_text())
    cfg["dtype"] = "float32"
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "merged_from.json").write_text(json.dumps({"base": str(base), "adapter": str(a)}))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
