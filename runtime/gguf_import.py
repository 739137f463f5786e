"""A .gguf file (what llama.cpp, LM Studio and Ollama users have) -> a Hugging Face checkpoint
directory that every Duet backend loads.

The file is read and dequantized to float32 once by transformers' GGUF loader (it uses the
`gguf` package's reader and knows each architecture's tensor names and tokenizer; a well-kept
reader beats a hand-written one), then saved with its tokenizer, chat template and generation
config into Duet's cache, keyed by the file's SHA-256: `<models_dir>/gguf/<sha256[:16]>/`.
The second run finds the directory at once (the digest of a path with the same size and mtime is
remembered in `<models_dir>/gguf/index.json`, so a 250 MB file is not hashed again).

A GGUF whose architecture Duet does not run is refused with one line naming it, before anything
is dequantized. This module does not quantize: the checkpoint holds the GGUF's values, dequantized.
"""

from __future__ import annotations

import hashlib
import json
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
    return convert_gguf(p, out)


def convert_gguf(path: Path, out: Path) -> Path:
    """Dequantize `path` into the checkpoint directory `out` (written whole, then moved into
    place, so an interrupted conversion leaves nothing half-written). Progress on stderr."""
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
    replace_dir(tmp, out)
    print(
        f"[gguf] converted in {time.perf_counter() - t0:.0f} s (once: later runs load it at once)",
        file=sys.stderr,
        flush=True,
    )
    return out
