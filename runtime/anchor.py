"""FlexSpec's anchor draft (§IV-A, eq. 4) as an ordinary two-layer checkpoint of the target's
family.

M_d(x) = H_small(B_shared(x)) is expressed *exactly* as a 2-layer model of the base's own
architecture (Qwen3 here), so every backend and export that runs a draft runs it unchanged:
- embed_tokens: the base's embedding (frozen);
- layer 0: a bit-exact copy of the base's last transformer block, the anchor B_L (frozen);
- layer 1: the head's two-layer MLP: its SwiGLU MLP and pre-norm (trained), with the
  attention's q/k/v/o weights all zero, so the attention adds exactly 0 to the residual;
- norm + lm_head: the vocabulary projection (norm trained, lm_head the base's, frozen).
The alternative, a new module in runtime/backends/torch/llama.py, would need its own MLX, ONNX
and Core ML paths; this costs one attention pass over zeros per token instead.

What ships is only the head (`anchor_head.safetensors`, layer 1's MLP and norms + the final
norm) and `anchor.json` (the base's fingerprint, the anchor layer, the training settings): the
frozen parts are the base's own tensors, so `materialize` assembles the full checkpoint from
the base, once, under `ANCHOR/.duet/`. It refuses a base whose weights hash differs. The LM
head is kept frozen so that the shipped head stays small (the repository's size budget).

Ablation, named as such (not FlexSpec's eq. 4): `keep_first` K > 0 keeps the base's first K
blocks too (frozen, bit-exact), before B_L and the head, for a deep base whose last block alone
carries too little (anchor.json records K; the head's layer is then K + 1).
This module does not train (apps/train/anchor.py does).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from runtime.adapter import base_fingerprint
from runtime.errors import DuetError
from runtime.paths import is_stale, sidecar

ANCHOR_RECORD = "anchor.json"
HEAD_FILE = "anchor_head.safetensors"


def is_anchor_dir(path) -> bool:
    """True for a shipped anchor draft (head + record, assembled against its base at load)."""
    return Path(path).is_dir() and (Path(path) / ANCHOR_RECORD).is_file()


def anchor_config(base_cfg: dict, keep_first: int = 0) -> dict:
    """The base's config.json made into the anchor draft's: 2 layers (eq. 4), or, for the
    ablation, the base's first `keep_first` blocks before them."""
    cfg = dict(base_cfg)
    n = keep_first + 2
    cfg["num_hidden_layers"] = n
    if "layer_types" in cfg:
        cfg["layer_types"] = cfg["layer_types"][:keep_first] + cfg["layer_types"][-1:] * 2
    cfg["max_window_layers"] = min(cfg.get("max_window_layers", n), n)
    cfg["tie_word_embeddings"] = False
    cfg["dtype"] = "float32"
    return cfg


def head_layer(keep_first: int = 0) -> int:
    """The index of the trained head's layer in the anchor draft (after the frozen blocks)."""
    return keep_first + 1


def assemble_state(base_state: dict, head: dict, n_layers: int, keep_first: int = 0) -> dict:
    """Full anchor-draft tensors from the base's and the head's (names of the draft's layers:
    the base's blocks 0..keep_first-1, then its last block B_L, then the head)."""
    import torch

    last = f"model.layers.{n_layers - 1}."
    anchor, hl = f"model.layers.{keep_first}.", f"model.layers.{head_layer(keep_first)}."
    emb = base_state["model.embed_tokens.weight"]  # a tied base's LM head: a copy, not a view
    out = {"model.embed_tokens.weight": emb,
           "lm_head.weight": base_state.get("lm_head.weight", emb.clone())}  # fmt: skip
    first = tuple(f"model.layers.{i}." for i in range(keep_first))  # the ablation's blocks
    for k, v in base_state.items():
        if first and k.startswith(first):
            out[k] = v  # bit-exact, at their own indices
        if k.startswith(last):
            out[anchor + k[len(last) :]] = v  # the anchor block B_L, bit-exact
            if ".self_attn." in k and "norm" not in k:
                out[hl + k[len(last) :]] = torch.zeros_like(v)  # attention adds 0
            elif "norm" in k:
                out[hl + k[len(last) :]] = v.clone()  # norms; unused over zeros
    out.update(head)  # the head layer's MLP and post-attention norm, the final norm
    return {k: v.float().contiguous() for k, v in out.items()}


def find_base(anchor_dir: Path, candidates: list[Path]) -> Path:
    """The first candidate directory whose weights hash is the one the anchor records."""
    rec = json.loads((anchor_dir / ANCHOR_RECORD).read_text())
    want = rec["base"]["base_sha256"]
    hint = anchor_dir / rec.get("base_hint", "")
    for c in [*candidates, hint]:
        if c and (Path(c) / "config.json").is_file() and any(Path(c).glob("*.safetensors")):
            if base_fingerprint(c) == want:
                return Path(c)
    raise DuetError(
        f"--draft {anchor_dir} is an anchor draft for the base target with weights "
        f"sha256 {want[:12]}...; none of {[str(c) for c in candidates]} is it "
        f"(pass that base as --target, or keep it at {hint})"
    )


def materialize(anchor_dir: str | Path, candidates: list[Path] = ()) -> Path:
    """The assembled anchor draft checkpoint directory (written once, then reused)."""
    from safetensors.torch import load_file, save_file

    a = Path(anchor_dir)
    base = find_base(a, list(candidates))
    out = sidecar(a, "draft")
    head_file = a / HEAD_FILE
    if not is_stale(out / "model.safetensors", [head_file]):
        return out
    base_cfg = json.loads((base / "config.json").read_text())
    base_state = {}
    for f in sorted(base.glob("*.safetensors")):
        base_state.update(load_file(str(f)))
    keep = int(json.loads((a / ANCHOR_RECORD).read_text()).get("keep_first", 0))
    state = assemble_state(
        base_state, load_file(str(head_file)), base_cfg["num_hidden_layers"], keep
    )
    tmp = out.with_name("draft.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        if (base / name).is_file():
            shutil.copy(base / name, tmp / name)
    (tmp / "config.json").write_text(json.dumps(anchor_config(base_cfg, keep), indent=2))
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out
