"""The step functions the training loop calls (`step_fn(x, y) -> (loss, metrics)`), and the
quick held-out check it runs at each checkpoint.

`ce_step` trains a model on the data (next-token loss); `distill_step` fits a draft to a frozen
teacher's logits (apps/train/losses.py `distill_loss`: KL, plus a data term and a TV term).
"""

from __future__ import annotations

import torch

from .evaluate import heldout_loss
from .losses import distill_loss, next_token_loss


def ce_step(model):
    def step(x, y):
        loss = next_token_loss(model(input_ids=x).logits, y)
        return loss, {}

    return step


def distill_step(
    draft, teacher, ce_weight: float, tv_weight: float = 0.0, temperature: float = 1.0
):
    def step(x, y):
        with torch.no_grad():
            t_logits = teacher(input_ids=x).logits
        return distill_loss(
            draft(input_ids=x).logits,
            t_logits,
            y,
            ce_weight=ce_weight,
            temperature=temperature,
            tv_weight=tv_weight,
        )

    return step


def quick_eval(model, windows, bf16: bool = True):
    def ev():
        dev = next(model.parameters()).device
        with torch.no_grad(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
            return {"heldout_loss_quick": round(heldout_loss(model, windows), 4)}

    return ev
