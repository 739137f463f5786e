"""The cloud verifier under abuse and load, on loopback: fuzzed frames, 64 concurrent clients,
disconnects, a killed server, wrong tokens, limits and session isolation. After each, a good
client still gets exactly the target's own tokens."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from edge_helpers import ar_tokens, flexspec

from apps.cloud.fuzz import fuzz
from apps.cloud.server import Limits, ServerThread, VerifierServer
from runtime.backends import load_model
from runtime.edge import wire
from runtime.edge.client import CloudError, Connection
from runtime.edge.codecs import codec
from runtime.errors import DuetError

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [11, 42, 7, 99, 5]
TOKEN = b"s3cret-token"


@pytest.fixture(scope="module")
def models(tiny_dir):
    target = load_model(tiny_dir("qwen3"), "torch", threads=1)
    draft = load_model(tiny_dir("qwen3", num_layers=1, hidden_size=32, seed=7), "onnx")
    return target, draft


@pytest.fixture
def server(models):
    st = ServerThread(models[0], token=TOKEN, limits=Limits(idle_timeout_s=5))
    yield st
    st.stop()


def wait_no_sessions(st, limit_s=10.0) -> int:
    t0 = time.monotonic()
    while st.open_sessions() and time.monotonic() - t0 < limit_s:
        time.sleep(0.02)
    return st.open_sessions()


def good_client_equals_ar(st, models, n=16):
    target, draft = models
    conn = Connection(st.host, st.port, TOKEN)
    assert flexspec(conn, draft, PROMPT, n, k=3).tokens == ar_tokens(target, PROMPT, n)
    conn.close()


def test_fuzzed_frames_get_errors_and_the_server_still_verifies(server, models):
    V = models[0].config.vocab_size
    out = fuzz(server.host, server.port, frames=300, seed=1, token=TOKEN, vocab=V, time_limit_s=60)
    assert out["frames"] >= 300
    errors = {k: v for k, v in out.items() if k.startswith("error_")}
    # every family of bad frame was named by its own error code
    for code in (
        wire.E_MALFORMED,
        wire.E_AUTH,
        wire.E_UNKNOWN_TYPE,
        wire.E_SESSION,
        wire.E_SEQUENCE,
        wire.E_CODEC,
        wire.E_VERSION,
    ):
        assert errors.get(f"error_{code}", 0) > 0, (code, out)
    assert out.get("kind_compressed", 0) > 0 and errors.get(f"error_{wire.E_INTERNAL}", 0) == 0
    assert wait_no_sessions(server) == 0
    good_client_equals_ar(server, models)
    assert wait_no_sessions(server) == 0


def test_64_concurrent_clients_each_get_their_own_ar_output(models):
    target, draft = models
    st = ServerThread(target, limits=Limits(max_sessions=64))
    prompts = [[(7 * i + j) % 300 + 1 for j in range(3 + i % 4)] for i in range(64)]
    want = [ar_tokens(target, p, 6) for p in prompts]
    got: list = [None] * 64
    barrier = threading.Barrier(64)

    def client(i):
        conn = Connection(st.host, st.port)
        barrier.wait(30)  # all 64 connected before anyone opens a session
        try:
            got[i] = flexspec(conn, draft, prompts[i], 6, k=1 + i % 4).tokens
        except Exception as e:  # surfaced by the assertion below
            got[i] = e
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    try:
        assert got == want
        assert wait_no_sessions(st) == 0
    finally:
        st.stop()


def _raw_session(st) -> tuple[socket.socket, int]:
    s = socket.create_connection((st.host, st.port), timeout=10)
    s.sendall(wire.pack(wire.HELLO, 0, 0, wire.hello(TOKEN)))
    s.recv(4096)
    s.sendall(wire.pack(wire.OPEN, 0, 1, wire.open_(wire.Open(0, 1, 0, 0, tuple(PROMPT)))))
    h = wire.unpack_header(s.recv(4096)[: wire.HEADER_SIZE])
    assert h.type == wire.OPENED
    return s, h.session


def test_disconnect_mid_round_frees_the_session(server, models):
    V = models[0].config.vocab_size
    for cut in (5, 20, None):  # inside the header, inside the payload, after a whole VERIFY
        s, sid = _raw_session(server)
        assert server.open_sessions() == 1
        frame = wire.pack(
            wire.VERIFY, sid, 2, wire.verify(1, len(PROMPT), codec("ids").encode([3, 4], None, V))
        )
        s.sendall(frame[:cut] if cut else frame)
        s.close()
        assert wait_no_sessions(server) == 0
    good_client_equals_ar(server, models)


def test_sessions_are_isolated(server, models):
    s, sid = _raw_session(server)
    other = Connection(server.host, server.port, TOKEN)
    other.open(PROMPT, 0, 1, 0, 0)
    other.session = sid  # try to drive the first client's session
    with pytest.raises(CloudError, match="names session"):
        other.verify(1, len(PROMPT), codec("ids").encode([1], None, 320))
    assert server.open_sessions() == 1  # the first client's session is untouched
    s.close()
    assert wait_no_sessions(server) == 0


def test_wrong_token_is_refused(server):
    with pytest.raises(CloudError, match="wrong token"):
        Connection(server.host, server.port, b"guess")
    assert server.open_sessions() == 0


def test_no_token_only_on_loopback(models):
    srv = VerifierServer(models[0], token=None)
    with pytest.raises(DuetError, match="without --token-file"):
        asyncio.run(srv.start("0.0.0.0", 0))
    srv.close()


def test_limits_sessions_context_and_frame_size(models):
    target, _ = models
    st = ServerThread(target, limits=Limits(max_sessions=1, max_context=12, max_frame=4096))
    try:
        a = Connection(st.host, st.port)
        a.open(PROMPT, 0, 1, 0, 0)
        with pytest.raises(CloudError, match="sessions are open"):
            Connection(st.host, st.port).open(PROMPT, 0, 1, 0, 0)
        with pytest.raises(CloudError, match="session limit"):
            a.verify(1, len(PROMPT), codec("ids").encode([1] * 7, None, 320))
        b = Connection(st.host, st.port)  # a's error closed a's connection and freed its slot
        with pytest.raises(CloudError, match="exceeds the 4096 limit"):
            b.request(wire.OPEN, b"\0" * 5000)
        assert wait_no_sessions(st) == 0
    finally:
        st.stop()


def test_killed_server_gives_one_clear_error_quickly(tiny_dir, models):
    _, draft = models
    cmd = [sys.executable, "-m", "apps.cloud", "serve", "--target", str(tiny_dir("qwen3")),
           "--target-backend", "torch", "--port", "0"]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), line
        port = int(line.strip().rpartition(":")[2])
        conn = Connection("127.0.0.1", port)
        from runtime.decoding import make_steps
        from runtime.decoding.events import GREEDY

        steps = make_steps(
            "flexspec", None, draft, PROMPT, max_new=200, sampling=GREEDY, seed=0, conn=conn, k=2
        )
        next(steps)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        t0 = time.monotonic()
        with pytest.raises(CloudError) as e:
            for _ in steps:
                pass
        elapsed = time.monotonic() - t0
        msg = str(e.value)
        assert "\n" not in msg and f"127.0.0.1:{port}" in msg
        print(f"client noticed the dead server after {elapsed * 1e3:.1f} ms: {msg}")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_generate_cli_flexspec_local_server_and_errors(tiny_dir, models, capsys, tmp_path):
    from runtime.generate import main

    td, dd = tiny_dir("qwen3"), tiny_dir("qwen3", num_layers=1, hidden_size=32, seed=7)
    base = ["--method", "flexspec", "--target", str(td), "--draft", str(dd),
            "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", "10", "--json"]  # fmt: skip
    assert main(base) == 0  # --server local: a verifier subprocess, stopped at exit
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == ar_tokens(models[0], PROMPT, 10)
    edge = out["stats"]["edge"]
    assert edge["rounds"] == out["stats"]["steps"] and len(edge["bytes_up"]) == edge["rounds"]
    assert all(b > wire.HEADER_SIZE for b in edge["bytes_up"] + edge["bytes_down"])
    # a dead address and a wrong token: one line each, exit 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    assert main(base + ["--server", f"127.0.0.1:{dead}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot reach the cloud verifier" in err and "\n" not in err
    st = ServerThread(models[0], token=TOKEN)
    bad = tmp_path / "tok"
    bad.write_text("nope")
    try:
        assert main(base + ["--server", f"{st.host}:{st.port}", "--token-file", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert "wrong token" in err and "\n" not in err
    finally:
        st.stop()


def test_idle_connection_gets_an_error_and_is_closed(models):
    st = ServerThread(models[0], limits=Limits(idle_timeout_s=0.2))
    try:
        s = socket.create_connection((st.host, st.port), timeout=10)
        s.sendall(wire.pack(wire.HELLO, 0, 0, wire.hello(b"")))
        s.recv(4096)  # WELCOME; then say nothing
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        h = wire.unpack_header(data[: wire.HEADER_SIZE])
        assert h.type == wire.ERROR
        assert wire.read_error(data[wire.HEADER_SIZE :])[0] == wire.E_IDLE
        s.close()
    finally:
        st.stop()


def test_serve_cli_refuses_a_public_address_without_a_token(capsys):
    from apps.cloud.__main__ import main

    assert main(["serve", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "without --token-file" in err and "\n" not in err
    assert main(["serve", "--token-file", "/nonexistent/token"]) == 2
    assert "no such file" in capsys.readouterr().err
