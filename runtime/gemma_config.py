"""Gemma 3's fields of config.json, for runtime/config.py's ModelConfig.

A `gemma3_text` config (or the `text_config` of a multimodal `gemma3` one) is completed with
transformers' Gemma3TextConfig defaults (multimodal configs leave most of them out), then read:
which layers are local (sliding-window) and which global (`layer_types`, else every
`sliding_window_pattern`-th layer global), the local layers' RoPE base beside the global one
(transformers >= 5 nests both under `rope_parameters`), the attention scale, the soft-caps and
the MLP activation. Gemma's per-layer kinds are kept apart from `layer_types`, which means
linear attention (Qwen3.5) to the rest of the runtime: a Gemma model is never hybrid.
"""

from __future__ import annotations

from runtime.errors import DuetError

# Gemma3TextConfig's defaults (transformers 5.23) for the fields we read
DEFAULTS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "eos_token_id": 1,
}
ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_new", "gelu_fast", "gelu")  # tanh forms, and exact


def gemma_fields(cfg: dict, where: str) -> tuple[dict, dict]:
    """(the text tower's config dict with defaults filled in and its global RoPE at the top
    level as `rope_theta` / `rope_scaling`, the ModelConfig fields only Gemma has)."""
    if cfg.get("model_type") == "gemma3":  # multimodal: the text tower lives under text_config
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise DuetError(f"{where}: a gemma3 config needs a text_config object")
        top = {k: cfg[k] for k in ("eos_token_id", "tie_word_embeddings") if k in cfg}
        cfg = {**top, **text, "multimodal": True}
    cfg = {**DEFAULTS, **cfg, "model_type": "gemma3_text"}
    if cfg.get("use_bidirectional_attention"):
        raise DuetError(f"{where}: a bidirectional Gemma 3 (an encoder) is not a causal LM")
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or DEFAULTS["hidden_activation"]
    if act not in ACTIVATIONS:
        raise DuetError(f"{where}: Gemma 3 hidden_activation {act!r} is not one of {ACTIVATIONS}")
    n = int(cfg["num_hidden_layers"])
    window = int(cfg.get("sliding_window") or 0)
    lt = cfg.get("layer_types")
    if lt is None:
        every = int(cfg.get("sliding_window_pattern") or cfg.get("_sliding_window_pattern") or 6)
        lt = ["sliding_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    if len(lt) != n or set(lt) - {"sliding_attention", "full_attention"}:
        raise DuetError(
            f"{where}: layer_types must be {n} of sliding_attention/full_attention, got {lt}"
        )
    sliding = tuple(t == "sliding_attention" and window > 0 for t in lt)
    local_theta, global_rope = _ropes(cfg)
    cfg = {**cfg, **global_rope}
    fields = {
        "sliding": sliding,
        "sliding_window": window if any(sliding) else 0,
        "rope_local_theta": local_theta,
        "query_pre_attn_scalar": float(cfg.get("query_pre_attn_scalar") or cfg["head_dim"]),
        "final_logit_softcapping": float(cfg.get("final_logit_softcapping") or 0.0),
        "attn_logit_softcapping": float(cfg.get("attn_logit_softcapping") or 0.0),
        "hidden_activation": act,
    }
    return cfg, fields


def _ropes(cfg: dict) -> tuple[float, dict]:
    """(the local layers' RoPE base, {"rope_theta": global base, "rope_scaling": global variant
    or absent}). transformers >= 5 writes `rope_parameters` = {"sliding_attention": {...},
    "full_attention": {...}}; older configs `rope_theta`, `rope_local_base_freq` and
    `rope_scaling` (the global layers' only)."""
    rp = cfg.get("rope_parameters")
    if isinstance(rp, dict) and ("full_attention" in rp or "sliding_attention" in rp):
        full = dict(rp.get("full_attention") or {})
        local = float((rp.get("sliding_attention") or {}).get("rope_theta", 10_000.0))
    else:
        full = dict(cfg.get("rope_scaling") or (rp if isinstance(rp, dict) else {}) or {})
        full.setdefault("rope_theta", cfg.get("rope_theta", 1_000_000.0))
        local = float(cfg.get("rope_local_base_freq", 10_000.0))
    theta = float(full.pop("rope_theta", cfg.get("rope_theta", 1_000_000.0)))
    kind = full.get("rope_type") or full.get("type") or "default"
    out: dict = {"rope_theta": theta, "rope_scaling": None}
    if kind != "default":
        out["rope_scaling"] = {**full, "rope_type": kind}
    return local, out
