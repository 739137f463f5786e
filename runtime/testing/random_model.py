"""A random transformers model of a config, seeded, with what its initialisation leaves flat
redrawn, saved as a Hugging Face directory: the step every random checkpoint
(random_checkpoint.py, random_gemma.py, random_hybrid.py) shares."""

from __future__ import annotations

from pathlib import Path


def save_random_model(cfg, path, seed: int, init=None) -> Path:
    """Build `cfg`'s transformers model from `seed`, let `init(name, parameter)` (under no_grad,
    in parameter order) redraw what transformers sets to constants, and save it to `path`."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    if init is not None:
        with torch.no_grad():
            for name, w in model.named_parameters():
                init(name, w)
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(p, safe_serialization=True)
    return p
