"""One cloud verifier, several LoRA adapters over one backbone (FlexSpec's evolving cloud):
each session picks one at OPEN and gets exactly `ar` on base + that adapter merged."""

import json
import struct
import threading

import numpy as np
import pytest
from edge_helpers import ar_tokens, flexspec
from test_evolving import make_adapter

from apps.cloud.fuzz import fuzz
from apps.cloud.server import ServerThread
from runtime.adapter_views import adapter_view, added_bytes
from runtime.backends import load_model
from runtime.edge import wire
from runtime.edge.client import CloudError, Connection
from runtime.loading import load_pair

PROMPT = [11, 42, 7, 99, 5]
N = 12


@pytest.fixture(scope="module")
def evolving(tiny_dir, tmp_path_factory):
    """(base dir, {name: adapter dir}, torch target, torch draft)."""
    base = tiny_dir("qwen3", num_layers=3, initializer_range=0.1)
    d = tmp_path_factory.mktemp("adapters")
    adapters = {"code": make_adapter(base, d / "code", seed=0),
                "prose": make_adapter(base, d / "prose", seed=1, r=2)}  # fmt: skip
    target = load_model(base, "torch", threads=1)
    draft = load_model(tiny_dir("qwen3", num_layers=1, hidden_size=32, seed=7), "torch", threads=1)
    return base, adapters, target, draft


@pytest.fixture(scope="module")
def refs(evolving):
    """Greedy `ar` tokens of the base and of base + each adapter merged at load."""
    base, adapters, target, _ = evolving
    out = {"": ar_tokens(target, PROMPT, N)}
    for name, ad in adapters.items():
        merged = load_pair(
            str(base),
            None,
            need_draft=False,
            target_backend="torch",
            adapter=str(ad),
            target_threads=1,
        ).target
        out[name] = ar_tokens(merged, PROMPT, N)
    assert out["code"] != out[""] and out["prose"] != out[""]  # the adapters change the output
    return out


@pytest.fixture(scope="module")
def server(evolving):
    base, adapters, target, _ = evolving
    views = {n: adapter_view(target, base, d) for n, d in adapters.items()}
    st = ServerThread(target, adapters=views)
    yield st
    st.stop()


def test_concurrent_sessions_on_two_adapters_equal_ar_on_the_merged(server, evolving, refs):
    draft = evolving[3]
    names = ["code", "prose", "", "code", "prose", ""]
    got: list = [None] * len(names)

    def client(i: int) -> None:
        conn = Connection(server.host, server.port, adapter=names[i])
        try:
            got[i] = flexspec(conn, draft, PROMPT, N, k=3).tokens
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(names))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert got == [refs[n] for n in names]


def test_unknown_adapter_gets_an_error_frame_and_others_are_served(server, evolving, refs):
    conn = Connection(server.host, server.port, adapter="nope")
    with pytest.raises(CloudError, match=r"adapter 'nope'.*holds: code, prose.*error 15"):
        conn.open(PROMPT, 0.0, 1.0, 0, 0)
    conn.close()
    # the fuzzer's OPENs with adapter fields (unknown, not UTF-8, lying) beside valid sessions
    out = fuzz(
        server.host,
        server.port,
        frames=120,
        seed=3,
        vocab=evolving[2].config.vocab_size,
        time_limit_s=60,
        adapters=("code", "prose"),
    )
    assert out.get("kind_adapter", 0) > 0 and out.get(f"error_{wire.E_ADAPTER}", 0) > 0, out
    assert out.get(f"error_{wire.E_INTERNAL}", 0) == 0, out
    conn = Connection(server.host, server.port, adapter="prose")
    assert flexspec(conn, evolving[3], PROMPT, N, k=2).tokens == refs["prose"]
    conn.close()


def test_open_without_adapter_is_version_1_byte_for_byte():
    o = wire.Open(0.5, 0.75, 7, 123, (1, 2, 3))
    v1 = struct.pack("<ffIQI3I", 0.5, 0.75, 7, 123, 3, 1, 2, 3)
    assert wire.open_(o) == v1 and wire.read_open(v1) == o
    named = wire.open_(wire.Open(0.5, 0.75, 7, 123, (1, 2, 3), "lora-x"))
    assert named == v1 + b"\x06lora-x" and wire.read_open(named).adapter == "lora-x"
    assert wire.read_open(v1 + b"\x00").adapter == ""  # an empty name: the base
    for bad in (v1 + b"\x07lora-x", v1 + b"\x02\xff\xfe", v1 + b"\x01ab"):
        with pytest.raises(wire.ProtocolError) as e:
            wire.read_open(bad)
        assert e.value.code == wire.E_MALFORMED


def test_a_view_adds_only_the_adapted_weights_and_leaves_the_base_alone(evolving):
    from safetensors.torch import load_file

    base, adapters, target, _ = evolving
    ids = np.array([PROMPT])
    before = target.forward(ids, target.new_cache())
    view = adapter_view(target, base, adapters["code"])
    keys = [
        k
        for k in load_file(str(adapters["code"] / "adapter_model.safetensors"))
        if k.endswith("lora_A.weight")
    ]
    params = dict(target.module.named_parameters())
    want = sum(
        params[k.removeprefix("base_model.model.").replace(".lora_A.weight", ".weight")].nbytes
        for k in keys
    )
    assert added_bytes(view, target) == want > 0
    assert np.array_equal(target.forward(ids, target.new_cache()), before)


def test_serve_refuses_an_adapter_for_another_base_in_one_line(evolving, tmp_path, capsys):
    from apps.cloud.__main__ import main
    from runtime.testing.random_checkpoint import make_checkpoint

    other = make_checkpoint(tmp_path / "other", "qwen3", num_layers=3, seed=5)
    ad = evolving[1]["code"]
    capsys.readouterr()
    assert main(["serve", "--target", str(other), "--adapter", f"code={ad}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "another base" in err and "\n" not in err, err
    assert (
        main(
            ["serve", "--target", str(evolving[0]), "--adapter", f"a={ad}", "--adapter", f"a={ad}"]
        )
        == 2
    )
    assert "given twice" in capsys.readouterr().err


def test_generate_flexspec_names_the_adapter(evolving, refs, server, capsys):
    from runtime.generate import main

    base, adapters, _, _ = evolving
    common = ["--method", "flexspec", "--target", str(base), "--draft-backend", "torch",
              "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", str(N), "--json",
              "--k", "3"]  # fmt: skip
    draft = str(evolving[3].load_spec[0])
    # a remote verifier holding both: the session names one
    assert (
        main(
            common
            + [
                "--draft",
                draft,
                "--server",
                f"{server.host}:{server.port}",
                "--adapter-name",
                "prose",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["tokens"] == refs["prose"]
    # --server local with --adapter: the local verifier holds base + that adapter
    assert main(common + ["--draft", draft, "--adapter", str(adapters["code"])]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == refs["code"]
    assert main(common + ["--draft", draft, "--adapter-name", "code"]) == 2
    assert "--server local pass --adapter" in capsys.readouterr().err


def test_bench_e2e_column_is_link_time_plus_measured_compute(server, evolving):
    """apps.bench evolving's ms/token: a session per prompt on the named adapter, the link on
    its virtual clock (so nothing sleeps), link time a part of the total."""
    from apps.bench.evolving_e2e import ms_per_token

    class One:  # the server fixture in place of the bench's verifier processes
        def get(self, base):
            return server.host, server.port, b""

    out = ms_per_token(
        One(),
        evolving[0],
        "code",
        evolving[3],
        [PROMPT, PROMPT[:3]],
        link="4g",
        max_new=6,
        k=2,
        eos=[],
    )
    assert out["e2e_tokens"] == 12 and 0 < out["e2e_mean_k"] <= 2  # K = 2, fewer at the end
    assert out["ms_per_token"] > out["link_ms_per_token"] > 0


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_a_view_equals_the_adapter_merged_at_load(evolving, backend):
    """Same weights bit for bit on the CPU, so the same logits, on both target backends."""
    base, adapters, _, _ = evolving
    ids = np.array([PROMPT])
    target = load_pair(str(base), None, need_draft=False, target_backend=backend).target
    merged = load_pair(
        str(base), None, need_draft=False, target_backend=backend, adapter=str(adapters["prose"])
    ).target
    view = adapter_view(target, base, adapters["prose"])
    want = merged.forward(ids, merged.new_cache())
    assert np.array_equal(view.forward(ids, view.new_cache()), want)
    assert not np.array_equal(target.forward(ids, target.new_cache()), want)
