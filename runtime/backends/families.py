"""The family rule every backend folder shares: a checkpoint's `model_type` (as
runtime/config.py reads it: a multimodal `gemma3` or `qwen3_5` config becomes its text tower's
`gemma3_text` / `qwen3_5_text`) names the module of the backend's folder that runs it, as
mlx-lm's `models/<model_type>.py` does. The table, `FAMILIES` (model_type -> module), is here:
torch, mlx and onnx run every family, with files of the same names, and each folder's
__init__.py offers it as its own (a backend that came to lack a family would keep a table of
its own). Model types that share a module (Llama, Qwen2 and Qwen3 share llama.py) map to the
same one, and a model type the backend lacks is one DuetError naming those it runs.
"""

from __future__ import annotations

import importlib

from runtime.errors import DuetError

FAMILIES = {  # model_type -> the file of a backend folder that runs it
    "llama": "llama",
    "qwen2": "llama",
    "qwen3": "llama",
    "gemma3_text": "gemma3_text",
    "qwen3_5_text": "qwen3_5",
}


def family(table: dict[str, str], config, backend: str) -> str:
    """The module name `table` gives `config`'s model type on `backend`."""
    try:
        return table[config.model_type]
    except KeyError:
        raise DuetError(
            f"the {backend} backend runs model_type {', '.join(sorted(table))}, "
            f"not {config.model_type!r}"
        ) from None


def family_module(package: str, table: dict[str, str], config):
    """The module of `package` (a backend folder) that runs `config`'s family, imported."""
    name = family(table, config, package.rsplit(".", 1)[-1])
    return importlib.import_module(f"{package}.{name}")
