"""Several LoRA adapters over one loaded backbone: a merged *view* of the base per adapter.

`adapter_view(target, base_dir, adapter_dir)` returns a model that runs base + adapter merged
(W' = W + s * B @ A, runtime/adapter.py's arithmetic, so its weights equal those of
`load_pair(..., adapter=DIR)` bit for bit on the CPU) but holds only the weights the adapter
touches: every other tensor (embeddings, norms, LM head, unadapted linears and layers) is the
base's own object, shared. The module tree is copied shallowly (a new object per module,
the same tensors), and only the adapted weights are replaced in the copy; the base is never
modified. The cloud verifier (apps/cloud) keeps one base and one view per `--adapter`.

Memory: a view adds exactly the adapted weights, merged, in the base's dtype: sum over adapted
linears of out x in x 4 bytes in float32 (`added_bytes` counts it from the tensors themselves;
the serve command prints it per adapter). Measured on the embedded target (float32, 60.0 MiB of
weights) with each shipped adapter (runtime/assets/evolving/lora-*: r = 8 on all seven linears
of layers 0..6): 42.0 MiB added per adapter (70 % of the base; the process RSS grew by 47 to
56 MiB per view on torch and MLX, the rest being allocator slack and the adapter's own file),
against 102 MiB for a second merged copy. A merged view trades memory for speed (no extra
matmul per token); unmerged LoRA would add only r (in + out) per linear, but is not this.

Backends: PyTorch (`TorchCausalLM`) and MLX (`MLXCausalLM`); any other target is refused with
one line. What it does not do: hybrid (Qwen3.5) targets, whose weight names differ from the
adapter's (use `--adapter` on a single-target command, which merges on disk), or swapping an
adapter in place.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

from runtime.adapter import check_adapter, lora_scale, merged_weight
from runtime.errors import DuetError

NAME_RE = re.compile(r"[A-Za-z0-9._+-]{1,64}")  # an adapter's name on the wire and the CLI


def parse_adapter_spec(spec: str) -> tuple[str, Path]:
    """`[NAME=]DIR` -> (NAME, DIR); NAME defaults to the directory's name."""
    name, sep, path = spec.partition("=")
    if not sep:
        name, path = Path(spec.rstrip("/")).name, spec
    if not NAME_RE.fullmatch(name):
        raise DuetError(
            f"--adapter {spec}: the name {name!r} must be 1 to 64 of A-Z a-z 0-9 . _ + - "
            "(give one as NAME=DIR)"
        )
    if not Path(path).is_dir():
        raise DuetError(f"--adapter {spec}: no such directory {path}")
    return name, Path(path)


def adapter_view(target, base_dir: str | Path, adapter_dir: str | Path):
    """A model equal to `target` with the adapter merged, sharing every untouched tensor.

    `target` was loaded from `base_dir` (the adapter is checked against that directory and
    refused with one DuetError line when it was trained on another base).
    """
    cfg, pairs = check_adapter(adapter_dir, base_dir)
    if getattr(target.config, "is_hybrid", False):
        raise DuetError(
            f"--adapter {adapter_dir}: several adapters over one hybrid (Qwen3.5) "
            "target are not supported; serve it merged (one per verifier)"
        )
    scale = lora_scale(cfg)
    backend = getattr(target, "backend", None)
    if backend == "torch":
        return _torch_view(target, pairs, scale, adapter_dir)
    if backend == "mlx":
        return _mlx_view(target, pairs, scale, adapter_dir)
    raise DuetError(
        f"--adapter {adapter_dir}: adapter views run on the torch or mlx target "
        f"backend (got {backend})"
    )


def _torch_clone(m):
    """A new module tree over the same tensors (parameters and buffers shared)."""
    c = copy.copy(m)
    c._parameters = dict(m._parameters)
    c._buffers = dict(m._buffers)
    c._modules = {k: None if v is None else _torch_clone(v) for k, v in m._modules.items()}
    return c


def _torch_view(target, pairs: dict, scale: float, adapter_dir):
    import torch

    module = _torch_clone(target.module)
    params = dict(target.module.named_parameters())
    for name, (A, B) in pairs.items():
        if name not in params:
            raise DuetError(f"--adapter {adapter_dir}: adapts {name}, which the base lacks")
        W = params[name]
        w = merged_weight(name, W.detach().cpu(), A, B, scale, adapter_dir)
        owner, leaf = name.rpartition(".")[::2]
        sub = module.get_submodule(owner)
        setattr(sub, leaf, torch.nn.Parameter(w.to(W.dtype).to(W.device), requires_grad=False))
    view = copy.copy(target)
    view.module = module
    view.load_spec = None  # not reloadable from one path
    return view


def _mlx_clone(m):
    """A new mlx-lm module tree (modules are dicts, layers lists) over the same arrays."""
    import mlx.nn as nn

    if isinstance(m, nn.Module):
        c = copy.copy(m)
        for k, v in m.items():
            c[k] = _mlx_clone(v)
        return c
    if isinstance(m, list):
        return [_mlx_clone(x) for x in m]
    if isinstance(m, dict):
        return {k: _mlx_clone(v) for k, v in m.items()}
    return m


def _mlx_view(target, pairs: dict, scale: float, adapter_dir):
    import mlx.core as mx
    import numpy as np
    import torch
    from mlx.utils import tree_flatten

    model = _mlx_clone(target.model)
    params = dict(tree_flatten(target.model.parameters()))
    for name, (A, B) in pairs.items():
        if name not in params:
            raise DuetError(f"--adapter {adapter_dir}: adapts {name}, which the base lacks")
        W = params[name]
        w = merged_weight(
            name, torch.from_numpy(np.array(W, dtype=np.float32)), A, B, scale, adapter_dir
        )
        *path, leaf = name.split(".")
        node = model
        for p in path:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[leaf] = mx.array(w.numpy()).astype(W.dtype)
    mx.eval(model.parameters())
    return type(target)(model, target.config)


def _tensors(model) -> dict[int, int]:
    """{storage id: bytes} of every weight the model holds."""
    if getattr(model, "backend", None) == "mlx":
        from mlx.utils import tree_flatten

        return {id(a): int(a.nbytes) for _, a in tree_flatten(model.model.parameters())}
    out = {}
    for t in [*model.module.parameters(), *model.module.buffers()]:
        out[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return out


def weight_bytes(model) -> int:
    """Bytes of the weights `model` holds."""
    return sum(_tensors(model).values())


def added_bytes(view, base) -> int:
    """Bytes `view` holds that `base` does not (what the adapter costs on top of the base)."""
    mine, shared = _tensors(view), _tensors(base)
    return sum(n for k, n in mine.items() if k not in shared)
