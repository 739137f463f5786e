"""The model configuration we rely on, read from a Hugging Face `config.json`.

This module knows which architectures Duet runs and validates a checkpoint
directory before any backend touches its weights. It does not load weights.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from runtime.errors import DuetError

# model_type -> (needs q/k RMSNorm, has q/k/v bias by default)
SUPPORTED = {
    "llama": (False, False),
    "qwen2": (False, True),
    "qwen3": (True, False),
    "qwen3_5_text": (True, False),  # hybrid: Gated DeltaNet + gated full attention
    "qwen3_5": (True, False),  # multimodal Qwen3.5: its text tower (`text_config`)
    "gemma3_text": (True, False),  # local sliding-window layers beside global ones
    "gemma3": (True, False),  # multimodal Gemma 3: its text tower (`text_config`)
}
HYBRID = ("qwen3_5_text", "qwen3_5")  # model types with linear-attention (state) layers
GEMMA = ("gemma3_text", "gemma3")  # local sliding-window + global attention (not hybrid)


@dataclass(frozen=True)
class ModelConfig:
    """The fields of config.json that the runtime uses, validated."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_context: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...] = ()
    rope_scaling: dict | None = None
    layer_types: tuple[str, ...] = ()  # hybrid: "linear_attention" / "full_attention" per layer
    # Gemma 3 (runtime/gemma_config.py): per layer, True = a local sliding-window layer
    sliding: tuple[bool, ...] = ()
    sliding_window: int = 0  # a local layer's query at p sees keys at (p - window, p]
    rope_local_theta: float = 0.0  # the local layers' RoPE base (rope_theta: the global ones')
    query_pre_attn_scalar: float = 0.0  # attention scores scaled by its -1/2 (0: head_dim's)
    final_logit_softcapping: float = 0.0  # logits = cap * tanh(logits / cap) (0: none)
    attn_logit_softcapping: float = 0.0  # read, not applied: transformers' Gemma 3 ignores it
    hidden_activation: str = "silu"  # the MLP's gate activation
    raw: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, cfg: dict, where: str = "config.json") -> ModelConfig:
        mt = cfg.get("model_type")
        if mt not in SUPPORTED:
            raise DuetError(
                f"{where}: unsupported architecture model_type={mt!r}; "
                f"Duet runs {', '.join(sorted(SUPPORTED))}"
            )
        qk_norm, default_bias = SUPPORTED[mt]
        if mt == "qwen3_5":  # the text tower's fields live under text_config
            text = cfg.get("text_config")
            if not isinstance(text, dict):
                raise DuetError(f"{where}: a qwen3_5 config needs a text_config object")
            cfg = {**text, "model_type": "qwen3_5_text", "multimodal": True}
            mt = "qwen3_5_text"
        gemma = {}
        if mt in GEMMA:
            from runtime.gemma_config import gemma_fields

            cfg, gemma = gemma_fields(cfg, where)
            mt = cfg["model_type"]
        try:
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            eos = cfg.get("eos_token_id")
            eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
            return cls(
                model_type=mt,
                vocab_size=int(cfg["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(cfg["intermediate_size"]),
                num_layers=int(cfg["num_hidden_layers"]),
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(
                    cfg.get(
                        "rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)
                    )
                ),
                max_context=int(cfg.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                attention_bias=bool(cfg.get("attention_bias", default_bias)),
                qk_norm=qk_norm,
                eos_token_ids=eos_ids,
                rope_scaling=_rope_scaling(cfg),
                layer_types=_layer_types(cfg) if mt in HYBRID else (),
                raw=cfg,
                **gemma,
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DuetError(f"{where}: malformed config ({type(e).__name__}: {e})") from None

    @property
    def is_hybrid(self) -> bool:
        """True when some layers are linear attention (a state cache, not a KV cache)."""
        return "linear_attention" in self.layer_types

    @classmethod
    def from_dir(cls, path: str | Path) -> ModelConfig:
        p = Path(path)
        if not p.exists():
            raise DuetError(f"checkpoint not found: {p}")
        if not p.is_dir():
            raise DuetError(f"{p}: expected a checkpoint directory (config.json + *.safetensors)")
        cfg_path = p / "config.json"
        if not cfg_path.is_file():
            raise DuetError(
                f"{p}: no config.json; is this a Hugging Face or MLX checkpoint directory?"
            )
        try:
            cfg = json.loads(cfg_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DuetError(f"{cfg_path}: not valid JSON ({e})") from None
        if not isinstance(cfg, dict):
            raise DuetError(f"{cfg_path}: expected a JSON object")
        return cls.from_dict(cfg, where=str(cfg_path))


def _rope_scaling(cfg: dict) -> dict | None:
    """The RoPE variant as a dict with "rope_type", or None for plain RoPE.

    transformers >= 5 writes `rope_parameters`; older configs write `rope_scaling`.
    """
    rs = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if not isinstance(rs, dict):
        return None
    kind = rs.get("rope_type") or rs.get("type") or "default"
    return None if kind == "default" else {**rs, "rope_type": kind}


def _layer_types(cfg: dict) -> tuple[str, ...]:
    """Qwen3.5's per-layer kinds: config.json's `layer_types`, else every
    `full_attention_interval`-th layer full attention (transformers' default rule)."""
    n = int(cfg["num_hidden_layers"])
    lt = cfg.get("layer_types")
    if lt is None:
        every = int(cfg.get("full_attention_interval", 4))
        lt = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    lt = tuple(str(t) for t in lt)
    bad = set(lt) - {"linear_attention", "full_attention"}
    if len(lt) != n or bad:
        raise ValueError(f"layer_types must be {n} of linear_attention/full_attention, got {lt}")
    return lt


def replace_dir(tmp: Path, out: Path) -> Path:
    """Put the finished directory `tmp` at `out`, replacing what was there, so that a crash
    mid-save never leaves a half-written checkpoint at `out` (the old one is kept aside as
    `out.old` until the new one is in place). Returns `out`."""
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return out
