import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# `--method auto` keeps what it measures per pair and machine (devices/probe_store.py): in a
# test run, in a folder of its own, never the user's ~/.cache (subprocesses inherit it)
# The real models a user pulled (`python -m apps.models pull`) stay where they are: fix their folder
# before DUET_CACHE_DIR moves (the `real` tests read them; runtime/registry.py models_dir)
import converters  # noqa: E402, F401 (the on-the-fly exporters, as every command registers them)
from runtime.registry import models_dir  # noqa: E402

os.environ.setdefault("DUET_MODELS_DIR", str(models_dir()))
_AUTO_CACHE = tempfile.mkdtemp(prefix="duet-test-auto-")
os.environ["DUET_CACHE_DIR"] = _AUTO_CACHE
atexit.register(shutil.rmtree, _AUTO_CACHE, True)
# Where a target runs when no flag names a backend is measured on the machine (a float
# checkpoint: PyTorch or ONNX Runtime, whichever is faster here: runtime/placement.py). A test's
# result must not depend on that race, so the suite pins the backend the tests were written for;
# tests/test_placement.py unpins it to test the rule itself (subprocesses inherit the pin).
os.environ["DUET_TARGET_BACKEND"] = "torch"

from tiny import ARCHS, make_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Factory: tiny_dir(model_type, **overrides) -> cached checkpoint directory."""
    made = {}

    def get(model_type: str = "qwen3", **kw):
        key = (model_type, tuple(sorted(kw.items())))
        if key not in made:
            d = tmp_path_factory.mktemp(f"{model_type}")
            made[key] = make_checkpoint(d, model_type, **kw)
        return made[key]

    return get


@pytest.fixture(scope="session")
def pair_dirs(tiny_dir):
    """(target dir, draft dir): the tiny Qwen3 target and a one-layer draft (seed 1), the pair
    the chat and server commands are driven with."""
    return tiny_dir("qwen3"), tiny_dir("qwen3", num_layers=1, seed=1)


@pytest.fixture(params=ARCHS)
def arch(request):
    return request.param


@pytest.fixture
def verifier():
    """start(target, **kw) -> a running loopback ServerThread; all are stopped afterwards."""
    from apps.cloud.server import ServerThread

    servers = []

    def start(target, **kw):
        st = ServerThread(target, **kw)
        servers.append(st)
        return st

    yield start
    for st in servers:
        st.stop()
