"""A new draft cut from the target itself: `draft-tune --from-target-layers I,J,...`.

The copy keeps the target's embedding, the decoder layers named (in that order), its final norm
and LM head; distillation then fits it to the whole target (drafts scaled for Mirror-SD's
overlap). Only full-attention layers can be copied.
"""

from __future__ import annotations

import copy

import torch

from runtime.errors import DuetError


def parse_layers(text: str, n_layers: int) -> list[int]:
    """`--from-target-layers` as a list of distinct layer indices of a target with `n_layers`."""
    try:
        layers = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise DuetError(f"--from-target-layers {text!r}: give layer numbers like 0,1,7") from None
    bad = [i for i in layers if not 0 <= i < n_layers]
    if not layers or bad or len(set(layers)) != len(layers):
        raise DuetError(f"--from-target-layers {text!r}: give distinct layers in 0..{n_layers - 1}")
    return layers


def target_layer_draft(teacher, layers: list[int]):
    """A new draft copied from the target: its embedding, decoder layers `layers` in that order,
    final norm and LM head (a truncated self-draft; distillation then fits it to the whole
    target). Layer indices are renumbered so the copy is an ordinary checkpoint."""
    cfg = teacher.config
    kinds = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    other = [f"{i} ({kinds[i]})" for i in layers if kinds[i] != "full_attention"]
    if other:
        raise DuetError(
            "--from-target-layers: only full-attention layers can be copied, not "
            + ", ".join(other)
        )
    d = copy.deepcopy(teacher)
    d.model.layers = torch.nn.ModuleList([d.model.layers[i] for i in layers])
    for j, layer in enumerate(d.model.layers):
        layer.self_attn.layer_idx = j
    d.config.num_hidden_layers = len(layers)
    if getattr(d.config, "layer_types", None):
        d.config.layer_types = [cfg.layer_types[i] for i in layers]
    return d.requires_grad_(True)
