"""`--method auto` keeps what it measured per pair and machine (devices/probe_store.py): a
later process chooses from the kept figures without probing, and any changed input, an old
or unreadable file, or --reprobe measures again."""

import json
import os
import shutil
import time

import pytest

import devices.pair_laws as laws
import devices.pair_probe as pp
import devices.pair_stages as stages
import devices.pair_trials as trials
import devices.probe_memo as memo
import runtime.decoding
from devices.probe_export import export_state, restore_state
from devices.probe_store import MAX_AGE_DAYS, STORE_VERSION, ProbeStore
from runtime.backends import load_model
from runtime.decoding import Sampling
from runtime.generate import build_parser, main

PROBES = (
    (stages, "_medians"),
    (stages, "_slowdown"),
    (stages, "_slowdown_process"),
    (trials, "trial_rate"),
)


@pytest.fixture
def pair(tiny_dir, tmp_path, monkeypatch):
    """A tiny pair copied into tmp_path, an empty kept-figures folder, and a fresh process's
    in-memory caches."""
    monkeypatch.setenv("DUET_CACHE_DIR", str(tmp_path / "kept"))
    t, d = tmp_path / "t", tmp_path / "d"
    shutil.copytree(tiny_dir("llama"), t)
    shutil.copytree(tiny_dir("llama", num_layers=1, seed=4), d)
    monkeypatch.setattr(memo, "CACHE", {})
    monkeypatch.setattr(memo, "ALPHA", {})
    # shorter trial and τ-seed runs: what is kept matters here, not how well it is measured
    monkeypatch.setattr(trials, "TRIAL_TOKENS", 8)
    monkeypatch.setattr(laws, "JOINT_RUN_TOKENS", 16)
    return t, d


def _run(t, d, *extra, temp="0") -> list[str]:
    argv = ["--target", str(t), "--draft", str(d), "--prompt-ids", "3,14,15,92,65",
            "--max-tokens", "12", "--json", "--temp", temp, *extra]  # fmt: skip
    return argv


def _no_probe(monkeypatch):
    """A new process (empty in-memory caches) in which any measurement fails the test."""
    monkeypatch.setattr(memo, "CACHE", {})
    monkeypatch.setattr(memo, "ALPHA", {})

    def boom(*a, **k):
        raise AssertionError("auto measured although the pair's figures were kept")

    for module, name in PROBES:
        monkeypatch.setattr(module, name, boom)
    monkeypatch.setattr(runtime.decoding, "run", boom)  # pair_taus's and α's seed runs


@pytest.mark.parametrize("temp", ["0", "1"])
def test_a_later_process_chooses_from_the_kept_figures_without_probing(
    pair, monkeypatch, capsys, temp
):
    t, d = pair
    assert build_parser().parse_args(["--prompt", "x"]).method == "auto"  # generate's default
    assert main(_run(t, d, temp=temp)) == 0
    first = capsys.readouterr()
    assert "[auto: measuring this pair on this machine first" in first.err
    one = json.loads(first.out)
    with monkeypatch.context() as m:
        _no_probe(m)
        assert main(_run(t, d, temp=temp)) == 0
    second = capsys.readouterr()
    assert "[auto: using the measurements of this pair on this machine kept in" in second.err
    two = json.loads(second.out)
    a1, a2 = one["stats"]["auto"], two["stats"]["auto"]
    assert a2["choice"] == two["stats"]["method"] and a2["predictions"]
    assert "(measured " in a2["inputs"]["source"] and "(measured " not in a1["inputs"]["source"]
    if temp == "0":  # greedy: whatever each picked, both are the target's own tokens
        assert main([*_run(t, d), "--method", "ar"]) == 0
        assert one["tokens"] == two["tokens"] == json.loads(capsys.readouterr().out)["tokens"]


def test_reprobe_and_a_changed_model_file_measure_again(pair, monkeypatch, capsys):
    t, d = pair
    assert main(_run(t, d)) == 0
    kept = list((t.parent / "kept" / "auto").iterdir())  # $DUET_CACHE_DIR/auto
    assert len(kept) == 1
    with monkeypatch.context() as m:
        _no_probe(m)
        assert main(_run(t, d)) == 0  # kept: nothing measured
        with pytest.raises(AssertionError, match="measured although"):
            main(_run(t, d, "--reprobe"))
    w = next(p for p in sorted(d.iterdir()) if p.suffix == ".safetensors")
    os.utime(w, ns=(w.stat().st_atime_ns, w.stat().st_mtime_ns + 10**9))  # a re-trained draft
    with monkeypatch.context() as m:
        _no_probe(m)
        with pytest.raises(AssertionError, match="measured although"):
            main(_run(t, d))
    capsys.readouterr()


def test_an_unreadable_or_old_file_is_said_once_and_measured_again(pair, monkeypatch, capsys):
    t, d = pair
    assert main(_run(t, d)) == 0
    capsys.readouterr()
    (path,) = (t.parent / "kept" / "auto").iterdir()
    doc = json.loads(path.read_text())
    path.write_text("{not json")
    monkeypatch.setattr(memo, "CACHE", {})
    assert main(_run(t, d)) == 0
    err = capsys.readouterr().err
    assert "ignoring the unreadable measurement cache" in err and "Traceback" not in err
    assert json.loads(path.read_text())["state"]["probe"]  # measured again and kept anew

    doc["state"]["probe"] = [
        {
            "table": "cache",
            "key": ["runs", "@target", "@draft", 0.0, 1.0, 0],
            "runs": {"risk": [1.0], "survived": []},
        }
    ]  # a truncated entry
    path.write_text(json.dumps(doc))
    monkeypatch.setattr(memo, "CACHE", {})
    assert main(_run(t, d)) == 0
    assert "ignoring the measurement cache" in capsys.readouterr().err

    doc = json.loads(path.read_text())
    doc["measured"] = time.time() - (MAX_AGE_DAYS + 1) * 86400
    path.write_text(json.dumps(doc))
    store = ProbeStore(path)
    assert store.load() is None and not store.restored  # a week old: drifted, measure again
    doc["measured"], doc["store"] = time.time(), STORE_VERSION - 1
    path.write_text(json.dumps(doc))  # an older store's figures follow older laws
    assert ProbeStore(path).load() is None


def test_a_model_not_loaded_from_files_keeps_nothing(tiny_dir):
    target = load_model(tiny_dir("llama"), "torch")
    draft = load_model(tiny_dir("llama", num_layers=1, seed=4), "torch")
    assert ProbeStore.for_pair(target, object()) is None  # in memory: nothing identifies it
    assert ProbeStore.for_pair(target, draft) is not None


def test_export_and_restore_are_inverse_for_one_pair_and_leave_other_pairs_out():
    class M:
        pass

    t, d, other = M(), M(), M()
    runs = laws.RunLengths()
    runs.add([3, 1, 0], 4)
    saved = dict(memo.CACHE)
    try:
        memo.CACHE.clear()
        memo.CACHE[(id(t), id(d), 4, 16, False, True, 8, 2, None)] = {
            "target_token": 0.01,
            "source": "measured",
        }
        memo.CACHE[("windows", id(t), id(d), (2, 4), 8, 2, None, True)] = {
            2: {"target_window": 0.1}
        }
        memo.CACHE[("runs", id(t), id(d), 0.0, 1.0, 0)] = runs
        memo.CACHE[("trial", "sd", id(t), id(other), 4, 0.0, 1.0, 0)] = 99.0  # another draft's
        memo.CACHE[("branches", id(t), id(d), 8, 2, 1.0, 1.0, 0)] = [40, 30, 20]  # mirror's hits
        entries = json.loads(json.dumps(export_state(t, d)))
        assert len(entries) == 4
        t2, d2 = M(), M()
        assert restore_state(t2, d2, entries, note="file (measured today)") == 4
        assert pp.branch_pool(t2, d2, Sampling(1.0), 8, 2) == [40, 30, 20]
        back = memo.CACHE[(id(t2), id(d2), 4, 16, False, True, 8, 2, None)]
        assert back == {"target_token": 0.01, "source": "measured, kept from file (measured today)"}
        assert memo.CACHE[("windows", id(t2), id(d2), (2, 4), 8, 2, None, True)] == {
            2: {"target_window": 0.1}
        }
        r2 = memo.CACHE[("runs", id(t2), id(d2), 0.0, 1.0, 0)]
        assert r2.taus([2, 4]) == runs.taus([2, 4])
    finally:
        memo.CACHE.clear()
        memo.CACHE.update(saved)


def test_an_emulated_model_is_kept_under_its_wrapped_model_and_the_emulation(tiny_dir):
    from types import SimpleNamespace

    from devices.probe_store import model_key

    real = load_model(tiny_dir("llama", num_layers=1, seed=4), "torch")
    emulated = SimpleNamespace(
        model=real,
        backend=f"{real.backend}+emulated",
        emu=SimpleNamespace(label="emulated:m3-max:a+b"),
    )
    key = model_key(emulated)
    assert key is not None and key["emulated"] == "emulated:m3-max:a+b"
    assert key["path"] == model_key(real)["path"] and key != model_key(real)


def test_a_state_already_written_is_not_written_again(tmp_path, monkeypatch):
    """auto keeps after every choice and every run; most choices change nothing, and then
    nothing is written (the file stays as it was), while a changed state is written."""
    store = ProbeStore(tmp_path / "pair.json")
    writes = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: writes.append(b) or real(a, b))
    store.save({"probe": [1, 2], "corrections": []})
    store.save({"corrections": [], "probe": [1, 2]})  # the same state, keys in another order
    assert len(writes) == 1
    store.save({"probe": [1, 2, 3], "corrections": []})
    assert len(writes) == 2
    assert json.loads((tmp_path / "pair.json").read_text())["state"]["probe"] == [1, 2, 3]
