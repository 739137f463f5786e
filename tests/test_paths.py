"""One rule for where Duet keeps things (runtime/paths.py): every cache folder follows
$DUET_CACHE_DIR, then $XDG_CACHE_HOME/duet, then ~/.cache/duet; a `.duet/` sidecar artefact is
rebuilt when missing or older than its sources."""

import os
from pathlib import Path

import pytest

from runtime import paths


def _every_cache_folder() -> dict[str, Path]:
    """What each user of the cache decides, asked through its own function."""
    from apps.bench import evolving
    from apps.bench.runners import llamacpp_server, ort_genai
    from devices import probe_store
    from runtime import registry
    from runtime.backends.onnx import gqa_buckets

    return {
        "models": registry.models_dir(),
        "gqa_buckets.json": gqa_buckets._store(),
        "auto": probe_store.cache_dir(),
        "llamacpp": llamacpp_server.cache_dir(),
        "ort-genai": ort_genai.cache_root(),
        "evolving": evolving.evolving_dir(),
    }


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No cache variable set, and a home of our own."""
    for var in ("DUET_CACHE_DIR", "DUET_MODELS_DIR", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def test_duet_cache_dir_moves_every_cache_folder(env, tmp_path):
    env.setenv("DUET_CACHE_DIR", str(tmp_path / "c"))
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # the Duet variable wins
    got = _every_cache_folder()
    assert got == {name: tmp_path / "c" / name for name in got}


def test_xdg_cache_home_then_home_when_duet_cache_dir_is_unset(env, tmp_path):
    env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    got = _every_cache_folder()
    assert got == {name: tmp_path / "xdg" / "duet" / name for name in got}
    env.delenv("XDG_CACHE_HOME")
    got = _every_cache_folder()
    assert got == {name: tmp_path / "home" / ".cache" / "duet" / name for name in got}


def test_a_tilde_is_expanded_everywhere(env, tmp_path):
    env.setenv("DUET_CACHE_DIR", "~/kept")
    got = _every_cache_folder()
    assert got == {name: tmp_path / "home" / "kept" / name for name in got}


def test_models_dir_keeps_its_own_override(env, tmp_path):
    env.setenv("DUET_CACHE_DIR", str(tmp_path / "c"))
    env.setenv("DUET_MODELS_DIR", "~/models")
    assert paths.cache_dir("models") == tmp_path / "home" / "models"
    assert paths.cache_dir("auto") == tmp_path / "c" / "auto"  # the others do not move


def test_a_sidecar_is_under_the_model_folder(tmp_path):
    assert paths.sidecar(tmp_path, "mtp", "step.onnx") == tmp_path / ".duet" / "mtp" / "step.onnx"
    assert paths.sidecar(str(tmp_path)) == tmp_path / ".duet"


def _touch(p: Path, t: float) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_bytes(b"x")
    os.utime(p, (t, t))
    return p


def test_a_sidecar_is_rebuilt_when_missing_or_older_than_a_source(tmp_path):
    w1, w2 = _touch(tmp_path / "a.safetensors", 1000), _touch(tmp_path / "b.safetensors", 2000)
    out = paths.sidecar(tmp_path, "model.onnx")
    assert paths.is_stale(out, [w1, w2])  # missing
    _touch(out, 1500)
    assert paths.is_stale(out, [w1, w2])  # older than the newest source
    assert not paths.is_stale(out, [w1])  # newer than every source given
    _touch(out, 2000)
    assert not paths.is_stale(out, tmp_path.glob("*.safetensors"))  # as new: fresh
    _touch(w2, 2001)
    assert paths.is_stale(out, tmp_path.glob("*.safetensors"))  # a re-trained weight
    assert not paths.is_stale(out, [tmp_path / "absent.safetensors"])  # no source: kept
    assert not paths.is_stale(out, [])
