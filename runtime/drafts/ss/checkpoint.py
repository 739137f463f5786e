"""Speculative-streaming draft checkpoints: a Hugging Face directory plus stream embeddings.

An SS draft directory is an ordinary Llama/Qwen2/Qwen3 checkpoint (config.json,
model.safetensors, tokenizer files) whose config.json carries
`"duet_speculative_streaming": {"streams": n, ...}` and whose safetensors hold one more
tensor, `ss_stream_embeddings` (n, H). Stripped of that tensor it is the main-stream model,
which transformers loads as is (it ignores the extra key with a warning).

It reads the format and writes it (`save_ss_checkpoint`); building the model from a
directory (`load_ss_module`) and making an SS checkpoint from an ordinary one
(`make_ss_checkpoint`) are runtime/drafts/ss/torch.py's. It does not train or decode.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.config import ModelConfig, replace_dir
from runtime.errors import DuetError

if TYPE_CHECKING:  # torch is imported where a model is built, not to read a config
    import torch

    from runtime.drafts.ss.torch import SSTorchLM

SS_KEY = "duet_speculative_streaming"  # config.json: {"streams": n, ...} marks an SS draft
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")


def ss_streams(cfg: ModelConfig) -> int:
    """Lookahead streams of an SS checkpoint's config (0: an ordinary model)."""
    spec = cfg.raw.get(SS_KEY)
    return int(spec.get("streams", 0)) if isinstance(spec, dict) else 0


def is_ss_dir(path) -> bool:
    """True when `path` is a checkpoint directory whose config marks an SS draft."""
    p = Path(path)
    if not (p / "config.json").is_file():
        return False
    try:
        return ss_streams(ModelConfig.from_dir(p)) > 0
    except DuetError:
        return False


def save_ss_checkpoint(
    module: SSTorchLM,
    out,
    src_dir,
    *,
    dtype: torch.dtype | None = None,
    extra: dict | None = None,
    keep: tuple[str, ...] = (),
) -> Path:
    """Write `module` as an SS checkpoint in `out` (config and side files from `src_dir`, the
    checkpoint it was initialised from); replaced atomically enough that a crash mid-save
    never leaves a half directory. dtype: bf16 by default. `extra` goes into the config's SS
    entry. Entries of an existing `out` named in `keep` (a trainer's resume state) are moved
    into the new directory."""
    import torch
    from safetensors.torch import save_file

    dtype = dtype or torch.bfloat16
    out, src = Path(out), Path(src_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cfg = json.loads((src / "config.json").read_text())
    cfg[SS_KEY] = {"streams": module.n_streams, "stream_position": "p+j",
                   "stream_input": "embed(x_p) + E_j", **(extra or {})}  # fmt: skip
    cfg["dtype"] = str(dtype).removeprefix("torch.")
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    state = {k: v.detach().to("cpu", dtype).contiguous() for k, v in module.state_dict().items()}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, tmp / name)
    for name in keep:
        if (out / name).exists():
            (out / name).rename(tmp / name)
    return replace_dir(tmp, out)
