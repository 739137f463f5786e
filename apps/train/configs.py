"""The target and draft shapes (Qwen3, or hybrid Qwen3.5) and their per-token compute.

Compute is counted as the weights of the matmuls one token passes through:
every linear in the decoder layers plus the LM head (the embedding lookup is
free). Attention over the context adds 4·T·n_heads·head_dim per layer for both
models alike and is reported separately. The draft must cost at most 1/8 of
the target per token.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from runtime.errors import DuetError

MAX_POSITIONS = 2048
MAX_DRAFT_RATIO = 1 / 8


@dataclass(frozen=True)
class Shape:
    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool


# Target: the least compute that makes 15 M parameters (an hour on 2 shared cores is far
# too little data for a bigger model to pay off); 8 narrow layers rather than 4 wide ones,
# so a 2-layer draft stays cheap next to it even where per-layer overhead dominates.
TARGET = Shape(384, 8, 1024, 6, 2, 64, tie_word_embeddings=False)
# Draft: 2 layers, the fewest that can form induction heads (copying identifiers is
# much of code); tied embeddings halve its size.
DRAFT = Shape(192, 2, 640, 3, 1, 64, tie_word_embeddings=True)


def parse_shape(text: str, tie: bool) -> Shape:
    """'HIDDEN,LAYERS,FFN,HEADS,KV_HEADS,HEAD_DIM' -> Shape, for --target-shape/--draft-shape."""
    try:
        d, n, f, h, kv, hd = (int(v) for v in text.split(","))
    except ValueError:
        raise DuetError(
            f"bad shape {text!r}: expected six integers HIDDEN,LAYERS,FFN,HEADS,KV_HEADS,HEAD_DIM"
        ) from None
    if min(d, n, f, h, kv, hd) <= 0 or h % kv:
        raise DuetError(
            f"bad shape {text!r}: sizes must be positive and HEADS divisible by KV_HEADS"
        )
    return Shape(d, n, f, h, kv, hd, tie)


def _dims(shape: Shape, vocab_size: int) -> dict:
    """The config keywords every family takes from a shape: sizes and attention heads."""
    return dict(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        head_dim=shape.head_dim,
    )


def _tail(shape: Shape, eos_token_id: int) -> dict:
    """The config keywords every family shares after its own: positions, tying, specials."""
    return dict(
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=shape.tie_word_embeddings,
        eos_token_id=eos_token_id,
        bos_token_id=None,
        pad_token_id=eos_token_id,
        rms_norm_eps=1e-6,
    )


def qwen3_config(shape: Shape, vocab_size: int, eos_token_id: int):
    from transformers import Qwen3Config

    return Qwen3Config(**_dims(shape, vocab_size), **_tail(shape, eos_token_id))


ARCHS = ("qwen3", "qwen3_5")
# Qwen3.5's pattern: three Gated DeltaNet (linear-attention) layers, then one gated full
# attention layer; a model shallower than 4 layers ends on its one full-attention layer.
FULL_ATTENTION_INTERVAL = 4


def layer_types(num_layers: int) -> list[str]:
    """'linear_attention' x3 then 'full_attention', repeated (the last layer of a model of
    fewer than FULL_ATTENTION_INTERVAL layers is full attention)."""
    every = min(FULL_ATTENTION_INTERVAL, num_layers)
    return [
        "full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(num_layers)
    ]


def qwen3_5_config(shape: Shape, vocab_size: int, eos_token_id: int):
    """A `qwen3_5_text` config of `shape`: full attention as in qwen3_config (plus Qwen3.5's
    output gate and partial RoPE), linear layers with one key and one value head per
    attention head, of the attention head's width, and Qwen3.5's conv kernel of 4."""
    from transformers import Qwen3_5TextConfig

    return Qwen3_5TextConfig(
        **_dims(shape, vocab_size),
        linear_num_key_heads=shape.num_heads,
        linear_num_value_heads=shape.num_heads,
        linear_key_head_dim=shape.head_dim,
        linear_value_head_dim=shape.head_dim,
        linear_conv_kernel_dim=4,
        layer_types=layer_types(shape.num_layers),
        **_tail(shape, eos_token_id),
    )


def model_config(arch: str, shape: Shape, vocab_size: int, eos_token_id: int):
    """The transformers config of `arch` ('qwen3' or 'qwen3_5') for `shape`."""
    if arch == "qwen3_5":
        return qwen3_5_config(shape, vocab_size, eos_token_id)
    return qwen3_config(shape, vocab_size, eos_token_id)


def causal_lm(config):
    """A freshly initialised transformers causal LM for `config` (Qwen3 or Qwen3.5 text)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(config)


def matmul_params(shape: Shape, vocab_size: int) -> int:
    """Weights of the matmuls per token: decoder-layer linears + LM head."""
    d, hd = shape.hidden_size, shape.head_dim
    attn = d * shape.num_heads * hd * 2 + d * shape.num_kv_heads * hd * 2  # q, o + k, v
    mlp = 3 * d * shape.intermediate_size  # gate, up, down
    return shape.num_layers * (attn + mlp) + d * vocab_size


def total_params(shape: Shape, vocab_size: int) -> int:
    d = shape.hidden_size
    norms = shape.num_layers * (2 * d + 2 * shape.head_dim) + d
    emb = vocab_size * d
    return matmul_params(shape, vocab_size) + norms + (0 if shape.tie_word_embeddings else emb)


def compute_summary(target: Shape, draft: Shape, vocab_size: int, context: int = 512) -> dict:
    """Parameter counts and the draft/target per-token FLOP ratio (2 FLOPs per weight)."""
    t, d = matmul_params(target, vocab_size), matmul_params(draft, vocab_size)

    def attn_flops(s: Shape) -> int:
        return s.num_layers * 4 * context * s.num_heads * s.head_dim

    return {
        "vocab_size": vocab_size,
        "target_shape": asdict(target),
        "draft_shape": asdict(draft),
        "target_params": total_params(target, vocab_size),
        "draft_params": total_params(draft, vocab_size),
        "target_matmul_flops_per_token": 2 * t,
        "draft_matmul_flops_per_token": 2 * d,
        "draft_target_flop_ratio": d / t,
        f"draft_target_flop_ratio_with_attention_at_{context}": (2 * d + attn_flops(draft))
        / (2 * t + attn_flops(target)),
    }


def counted_summary(summary: dict, target_cfg, draft_cfg) -> dict:
    """`summary` with parameter counts and the matmul FLOP ratio counted on built models
    (for layouts whose linears the formulas above do not describe, such as Qwen3.5's
    Gated DeltaNet layers: the conv1d and the per-head decay are counted as parameters,
    not as matmul weights)."""
    import torch

    def counts(cfg) -> tuple[int, int]:
        m = causal_lm(cfg)
        lin = sum(x.weight.numel() for x in m.modules() if isinstance(x, torch.nn.Linear))
        return sum(p.numel() for p in m.parameters()), lin

    (tp, tm), (dp, dm) = counts(target_cfg), counts(draft_cfg)
    return {
        **{k: v for k, v in summary.items() if "flop" not in k},
        "target_params": tp,
        "draft_params": dp,
        "target_matmul_flops_per_token": 2 * tm,
        "draft_matmul_flops_per_token": 2 * dm,
        "draft_target_flop_ratio": dm / tm,
    }


def check_draft_budget(summary: dict, allow_over: bool = False) -> None:
    r = summary["draft_target_flop_ratio"]
    if r > MAX_DRAFT_RATIO and not allow_over:
        raise DuetError(
            f"the draft costs {r:.3f} of the target per token, over the 1/8 budget; "
            f"shrink --draft-shape or grow --target-shape"
        )


def pair_configs(a, vocab: int, eos: int):
    """(compute summary, target config, draft config) of a run's `a.arch`, `a.target_shape`
    and `a.draft_shape` (apps/train/pipeline.py TrainArgs); the draft's budget checked."""
    summary = compute_summary(a.target_shape, a.draft_shape, vocab, a.seq_len)
    t_cfg = model_config(a.arch, a.target_shape, vocab, eos)
    d_cfg = model_config(a.arch, a.draft_shape, vocab, eos)
    if a.arch != "qwen3":
        summary = counted_summary(summary, t_cfg, d_cfg)
    summary["arch"] = a.arch
    check_draft_budget(summary, a.allow_draft_over_budget)
    return summary, t_cfg, d_cfg
