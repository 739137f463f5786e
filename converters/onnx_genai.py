"""An ONNX Runtime GenAI model folder: model.onnx + genai_config.json + tokenizer files.

`python -m converters export --format onnx --out DIR` (a path not ending in .onnx)
writes what `onnxruntime_genai.Model(DIR)` loads as is: the dynamic-shape export of
onnx_export.py (its I/O names are the ones genai's decoder-only models use), a
genai_config.json describing it (fp32 KV cache that grows, past and present as
separate buffers, CPU provider), and the checkpoint's tokenizer.json,
tokenizer_config.json, config.json and generation_config.json. It does not check
that genai agrees with us token for token: tests/test_convert_genai.py does,
with the real package.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from converters.genai_config import genai_decoder
from runtime.config import ModelConfig
from runtime.errors import DuetError

MODEL_FILE = "model.onnx"
CONFIG_FILE = "genai_config.json"
COPIED = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json",
          "special_tokens_map.json", "chat_template.jinja")  # fmt: skip
GENAI_TYPES = ("llama", "qwen2", "qwen3")  # decoder-only types genai runs with this layout


def genai_dynamic_config(cfg: ModelConfig) -> dict:
    """genai_config.json for the dynamic export: a growing fp32 cache on the CPU provider."""
    if cfg.model_type not in GENAI_TYPES:
        raise DuetError(
            f"model_type {cfg.model_type!r} has no ONNX Runtime GenAI layout here; "
            f"supported: {', '.join(GENAI_TYPES)}"
        )
    eos = list(cfg.eos_token_ids)
    bos = cfg.raw.get("bos_token_id")
    return {
        "model": {
            "type": cfg.model_type,
            "vocab_size": cfg.vocab_size,
            "context_length": cfg.max_context,
            "bos_token_id": bos if isinstance(bos, int) else (eos[0] if eos else 0),
            # genai needs an eos id in the vocabulary; a checkpoint without one gets the last id
            "eos_token_id": (eos[0] if len(eos) == 1 else eos) if eos else cfg.vocab_size - 1,
            "pad_token_id": eos[0] if eos else 0,
            "decoder": genai_decoder(
                cfg, MODEL_FILE, {"provider_options": [], "intra_op_num_threads": 1}
            ),
        },
        "search": {
            "max_length": cfg.max_context,
            "min_length": 0,
            "do_sample": False,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,  # present = past + new rows (onnx_export.py)
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
            "repetition_penalty": 1.0,
            "early_stopping": True,
        },
    }


def prepare_folder(model_dir: str | Path, out: str | Path) -> tuple[Path, ModelConfig]:
    """Check the source and the output folder before the export runs; returns (out, config)."""
    src, out = Path(model_dir), Path(out)
    cfg = ModelConfig.from_dir(src)
    if not (src / "tokenizer.json").is_file():
        raise DuetError(f"{src}: no tokenizer.json; ONNX Runtime GenAI needs the tokenizer")
    genai_dynamic_config(cfg)  # refuses an unsupported type before the export
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DuetError(f"--out {out}: exists and is not an empty directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DuetError(f"--out {out}: cannot create it ({e.strerror})") from None
    return out, cfg


def finish_folder(model_dir: str | Path, out: Path, cfg: ModelConfig) -> dict:
    """Write genai_config.json and copy the tokenizer files beside out/model.onnx."""
    src = Path(model_dir)
    (out / CONFIG_FILE).write_text(json.dumps(genai_dynamic_config(cfg), indent=2) + "\n")
    copied = []
    for name in COPIED:
        if (src / name).is_file():
            shutil.copy2(src / name, out / name)
            copied.append(name)
    if "tokenizer_config.json" not in copied:  # genai's tokenizer reads it; a minimal one will do
        (out / "tokenizer_config.json").write_text(
            json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}) + "\n"
        )
        copied.append("tokenizer_config.json (written)")
    return {"genai_config": str(out / CONFIG_FILE), "copied": copied}
