"""Training objectives: next-token cross-entropy, and distillation to a teacher.

Logits come out of bf16 autocast; every loss is computed in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def next_token_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy per token. logits (B, T, V), y (B, T)."""
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


def distill_loss(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor,
    y: torch.Tensor,
    ce_weight: float = 0.0,
    temperature: float = 1.0,
    tv_weight: float = 0.0,
) -> tuple[torch.Tensor, dict]:
    """KL(teacher || student) per token at `temperature`, plus `ce_weight` x data loss, plus
    `tv_weight` x the total variation distance TV(p, q) = ½ Σ|p - q| at `temperature`.

    Forward KL makes the student cover the teacher's whole distribution, which is
    what both greedy acceptance (same argmax) and rejection sampling (overlap of
    p and q) reward. 1 - TV is exactly the probability that rejection sampling accepts a
    token drawn from q (Leviathan et al. 2023, §3.2: β = Σ min(p, q)), so the TV term aims
    straight at acceptance when sampling (DistillSpec's TVD objective); its metric `tv` is
    reported whatever the weight. Returns (loss, metrics) with metrics as floats.
    """
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)  # (B, T, V)
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    kl = (t.exp() * (t - s)).sum(-1).mean() * temperature**2
    ce = F.cross_entropy(student_logits.float().flatten(0, 1), y.flatten())
    tv = 0.5 * (t.exp() - s.exp()).abs().sum(-1).mean()
    loss = kl + ce_weight * ce if ce_weight else kl
    if tv_weight:
        loss = loss + tv_weight * tv
    with torch.no_grad():
        agree = (student_logits.argmax(-1) == teacher_logits.argmax(-1)).float().mean()
    return loss, {"kl": kl.item(), "ce": ce.item(), "top1_agree": agree.item(), "tv": tv.item()}
