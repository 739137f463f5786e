"""Speculative-streaming draft checkpoints: a Hugging Face directory plus stream embeddings.

An SS draft directory is an ordinary Llama/Qwen2/Qwen3 checkpoint (config.json,
model.safetensors, tokenizer files) whose config.json carries
`"duet_speculative_streaming": {"streams": n, ...}` and whose safetensors hold one more
tensor, `ss_stream_embeddings` (n, H). Stripped of that tensor it is the main-stream model,
which transformers loads as is (it ignores the extra key with a warning).

`make_ss_checkpoint` turns an ordinary checkpoint into an SS one (random stream embeddings):
the starting point of `python -m apps.train ss-draft` and the tests' tiny SS drafts.
This module does not train and does not decode.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.config import ModelConfig, replace_dir, weight_files
from runtime.errors import DuetError

if TYPE_CHECKING:  # torch is imported where a model is built, not to read a config
    import torch

    from runtime.backends.torch_ss import SSTorchLM

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


def load_ss_module(path, dtype: torch.dtype | None = None) -> SSTorchLM:
    """Build an SSTorchLM (float32 unless `dtype`) from an SS checkpoint directory (strict:
    every weight present)."""
    import torch
    from safetensors.torch import load_file

    from runtime.backends.torch_ss import SSTorchLM

    cfg = ModelConfig.from_dir(path)
    n = ss_streams(cfg)
    if n < 1 or cfg.is_hybrid:
        raise DuetError(f"{path}: not a speculative-streaming draft (no {SS_KEY} in config.json)")
    state = {}
    for f in weight_files(path):
        state.update(load_file(str(f)))
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}
    if cfg.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    model = SSTorchLM(cfg, n)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise DuetError(
            f"{path}: weights do not match an SS {cfg.model_type} draft with {n} streams "
            f"(missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]})"
        )
    return model.to(dtype or torch.float32).eval()


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


def make_ss_checkpoint(
    src_dir, out, streams: int, *, seed: int = 0, scale: float = 0.02, dtype=None
) -> Path:
    """An SS checkpoint in `out` from the ordinary checkpoint `src_dir`: its weights, and
    stream embeddings drawn N(0, scale^2) (seeded). dtype: that of the source by default."""
    import torch

    from runtime.backends.torch_ref import load_torch_lm
    from runtime.backends.torch_ss import SSTorchLM

    if streams < 1:
        raise DuetError(f"--streams must be at least 1 (got {streams})")
    base = load_torch_lm(src_dir)
    cfg = ModelConfig.from_dir(src_dir)
    module = SSTorchLM(cfg, streams)
    module.load_state_dict(base.state_dict(), strict=False)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        module.ss_stream_embeddings.copy_(
            torch.randn(streams, cfg.hidden_size, generator=g) * scale
        )
    if dtype is None:
        from safetensors import safe_open

        with safe_open(str(weight_files(src_dir)[0]), "pt") as f:
            dtype = f.get_slice(next(iter(f.keys()))).get_dtype()
        dtype = {"BF16": torch.bfloat16, "F16": torch.float16}.get(dtype, torch.float32)
    return save_ss_checkpoint(module, out, src_dir, dtype=dtype)
