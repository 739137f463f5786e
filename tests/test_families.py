"""Each backend's family table (runtime/backends/<backend>/__init__.py's FAMILIES) names a file of
its folder for every model type runtime/config.py reads, and that file exports the entry its
backend's loader calls; a model type a backend lacks is one DuetError naming those it runs."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

from runtime.backends.families import family
from runtime.config import SUPPORTED
from runtime.errors import DuetError

# model types after config.py's reading: a multimodal config becomes its text tower's
READ_AS = {"gemma3": "gemma3_text", "qwen3_5": "qwen3_5_text"}
ENTRY = {"torch": ("Model", "sanitize"), "mlx": ("load",), "onnx": ("load",)}


@pytest.mark.parametrize("backend", sorted(ENTRY))
def test_every_model_type_has_a_family_file_with_its_entry(backend):
    package = f"runtime.backends.{backend}"
    table = importlib.import_module(package).FAMILIES
    assert set(table) == {READ_AS.get(mt, mt) for mt in SUPPORTED}
    for name in set(table.values()):
        module = importlib.import_module(f"{package}.{name}")
        assert all(hasattr(module, attr) for attr in ENTRY[backend]), (backend, name)


def test_an_unknown_model_type_names_what_the_backend_runs():
    with pytest.raises(DuetError, match="the torch backend runs model_type gemma3_text, llama"):
        family(
            {"llama": "llama", "gemma3_text": "gemma3_text"},
            SimpleNamespace(model_type="mamba"),
            "torch",
        )
