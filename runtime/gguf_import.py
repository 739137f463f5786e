"""A .gguf file (what llama.cpp, LM Studio and Ollama users have) -> a checkpoint directory
every Duet backend loads, in two stages, so a backend that runs the GGUF's own blocks never
pays for a float copy of the model:

1. `checkpoint_for_gguf` writes the *description* at once: config.json, generation_config.json,
   the tokenizer and chat template (transformers' GGUF readers, from the header alone: no
   tensor data is read), and `duet-source.json` naming the file. This is all the ONNX Runtime
   target needs: it builds its graph from the GGUF's tensors, one at a time
   (converters/gguf_target.py), so a 1 GB file loads in about 1 GB.
2. `materialize_weights` dequantizes the weights into safetensors the first time a backend
   asks for them (runtime/weights.weight_files: PyTorch, Core ML, MLX, a draft). transformers'
   GGUF loader does it (it uses the `gguf` package's reader and knows each architecture's
   tensor names; a well-kept reader beats a hand-written one).

The directory lives in Duet's cache, keyed by the file's SHA-256:
`<models_dir>/gguf/<sha256[:16]>/`. The second run finds it at once (the digest of a path with
the same size and mtime is remembered in `<models_dir>/gguf/index.json`, so a 250 MB file is not
hashed again). A GGUF whose architecture Duet does not run is refused with one line naming it,
before anything is written. `convert_gguf` does both stages at once (`apps.models pull`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import time
from pathlib import Path

from runtime.config import SUPPORTED, replace_dir
from runtime.errors import DuetError
from runtime.registry import models_dir

# general.architecture in the GGUF -> the config.json model_type transformers writes for it
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}


def gguf_metadata(path: Path) -> dict:
    """{"architecture", "file_type", "tensors"} from the header alone (no tensor data read)."""
    from gguf import GGUFReader

    try:
        r = GGUFReader(str(path))
    except Exception as e:  # not a GGUF at all, truncated, ...: one line
        raise DuetError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None

    def field(key: str):
        f = r.fields.get(key)
        if f is None:
            return None
        v = f.parts[f.data[0]]
        return bytes(v).decode() if f.types and f.types[0].name == "STRING" else v.tolist()[0]

    return {
        "architecture": field("general.architecture"),
        "file_type": field("general.file_type"),
        "name": field("general.name"),
        "tensors": len(r.tensors),
    }


def check_architecture(path: Path, meta: dict) -> str:
    """The model_type Duet will run, or one line naming the architecture it does not."""
    arch = meta.get("architecture")
    mt = ARCHITECTURES.get(arch)
    if mt is None or mt not in SUPPORTED:
        runs = sorted(a for a, t in ARCHITECTURES.items() if t in SUPPORTED)
        raise DuetError(
            f"{path}: GGUF architecture {arch!r} is not one Duet runs (it runs {', '.join(runs)})"
        )
    return mt


def file_digest(path: Path) -> str:
    """SHA-256 of the file, remembered per (path, size, mtime) in the cache's index."""
    st = path.stat()
    key = f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}"
    index_path = models_dir() / "gguf" / "index.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    if key in index:
        return index[key]
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    index[key] = h.hexdigest()
    try:
        index_path.parent.mkdir(parents=True, exist_ok=True)
        index_path.write_text(json.dumps(index, indent=1))
    except OSError:
        pass  # a read-only cache still works, it hashes again next time
    return index[key]


def checkpoint_for_gguf(path: str | Path) -> Path:
    """The cached checkpoint directory for a .gguf file, converting it on first use."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DuetError(f"{p}: no such GGUF file")
    out = models_dir() / "gguf" / file_digest(p)[:16]
    if (out / "config.json").is_file():
        return out
    return describe_gguf(p, out)


def gguf_source(d: str | Path) -> Path | None:
    """The GGUF a checkpoint directory was described from (its duet-source.json), else None."""
    f = Path(d) / "duet-source.json"
    try:
        src = json.loads(f.read_text()).get("gguf") if f.is_file() else None
    except (OSError, ValueError, AttributeError):
        return None
    return Path(src) if src else None


def _read_description(path: Path):
    """(config, tokenizer) from the GGUF's header, through transformers' GGUF readers."""
    import transformers
    from transformers import AutoConfig, AutoTokenizer

    transformers.logging.set_verbosity_error()
    try:
        cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (ValueError, KeyError, RuntimeError, NotImplementedError) as e:
        raise DuetError(
            f"{path}: transformers could not read this GGUF ({str(e).splitlines()[0]})"
        ) from None
    return cfg, tok


def describe_gguf(path: Path, out: Path) -> Path:
    """Stage 1: the directory `out` without weights (written whole, then moved into place)."""
    from transformers import GenerationConfig

    meta = gguf_metadata(path)
    check_architecture(path, meta)
    cfg, tok = _read_description(path)
    tmp = out.with_name(out.name + ".tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        cfg.save_pretrained(str(tmp))
        GenerationConfig.from_model_config(cfg).save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / "duet-source.json").write_text(
            json.dumps({"gguf": str(path.resolve()), "sha256": file_digest(path), **meta}, indent=1)
        )
    except OSError as e:
        raise DuetError(f"cannot write the GGUF's description to {tmp} ({e})") from None
    return replace_dir(tmp, out)


def materialize_weights(d: Path) -> None:
    """Stage 2: the GGUF's weights, dequantized, as safetensors in `d` (once)."""
    src = gguf_source(d)
    if src is None or not src.is_file():
        raise DuetError(f"{d}: its weights come from {src}, which is no longer there")
    check_float_fits(src)
    convert_gguf(src, d, weights_only=True)


FLOAT_SHARE = 0.5  # float weights may take at most this share of the machine's memory


def physical_memory() -> int:
    """This machine's memory in bytes (0 where the platform does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def check_float_fits(src: Path) -> None:
    """Refuse, in one line, a GGUF whose float32 weights (transformers' dequantization, then
    the PyTorch model) would take more than FLOAT_SHARE of memory: the ONNX target runs its
    blocks as they are."""
    from gguf import GGUFReader

    params = sum(int(t.n_elements) for t in GGUFReader(str(src)).tensors)
    need, have = 4 * params, physical_memory()
    if have and need > FLOAT_SHARE * have:
        raise DuetError(
            f"{src.name}: its float32 weights would take {need / 1e9:.1f} GB of this machine's "
            f"{have / 1e9:.1f} GB; run it with --target-backend onnx (its own 4-bit blocks, "
            "about the file's size) or mlx"
        )


def convert_gguf(path: Path, out: Path, weights_only: bool = False) -> Path:
    """Dequantize `path` into the checkpoint directory `out` (written whole, then moved into
    place, so an interrupted conversion leaves nothing half-written; `weights_only`: the
    safetensors alone, moved into the described directory `out`). Progress on stderr."""
    meta = gguf_metadata(path)
    check_architecture(path, meta)
    size = path.stat().st_size / 1e6
    print(
        f"[gguf] {path.name}: {meta['architecture']}, {meta['tensors']} tensors, {size:.0f} MB; "
        f"dequantizing to float32 once into {out}",
        file=sys.stderr,
        flush=True,
    )
    t0 = time.perf_counter()
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.enable_progress_bar()  # its per-tensor bar is ours
    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, quantization_config=GgufConfig(dequantize=True)
        )
    except (ValueError, KeyError, RuntimeError, NotImplementedError) as e:
        raise DuetError(
            f"{path}: transformers could not read this GGUF ({str(e).splitlines()[0]})"
        ) from None
    tmp = out.with_name(out.name + ".tmp")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        (tmp / "duet-source.json").write_text(
            json.dumps({"gguf": str(path.resolve()), "sha256": file_digest(path), **meta}, indent=1)
        )
    except OSError as e:
        raise DuetError(f"cannot write the converted checkpoint to {tmp} ({e})") from None
    del model
    if weights_only:
        for f in tmp.glob("*.safetensors*"):
            f.replace(out / f.name)
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        replace_dir(tmp, out)
    print(
        f"[gguf] converted in {time.perf_counter() - t0:.0f} s (once: later runs load it at once)",
        file=sys.stderr,
        flush=True,
    )
    return out
