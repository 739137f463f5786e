"""The companion bundle as the whole edge side: it generates through a loopback cloud verifier
with the target's own greedy tokens, the verifier refuses a bundle for another vocabulary or
base at HELLO, and a tampered profile or codec file is refused before any connection."""

import json
import shutil
import socket

import pytest
from edge_helpers import ar_tokens

from apps.cloud.server import ServerThread
from apps.companion.__main__ import main
from apps.companion.manifest import write_manifest
from apps.companion.package import package_bundle
from apps.companion.verify import verify_bundle
from runtime.backends import load_model
from runtime.edge import wire
from runtime.edge.client import CloudError, Connection
from runtime.edge.identity import target_identity

pytestmark = pytest.mark.filterwarnings("ignore")
TOKEN = b"bundle-token"
PROMPT = [5, 17, 99, 3, 250, 11]


@pytest.fixture(scope="module")
def bundle(tiny_dir, tmp_path_factory):
    """The target packaged as its own draft (everything accepted), ONNX only, context 16."""
    out = tmp_path_factory.mktemp("edge-bundle") / "bundle"
    package_bundle(
        tiny_dir("qwen3"),
        out,
        target=tiny_dir("qwen3"),
        max_context=16,
        prefill_len=4,
        onnx_provider="cpu",
        profile="snapdragon-8-gen-3",
        codec="ids",
        coreml=False,
    )
    return out


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    p = tmp_path_factory.mktemp("tok") / "token"
    p.write_bytes(TOKEN + b"\n")
    return str(p)


def serve(ckpt):
    """A loopback verifier for checkpoint `ckpt` that knows its identity."""
    target = load_model(ckpt, "torch", threads=1)
    return target, ServerThread(target, token=TOKEN, identity=target_identity(ckpt))


@pytest.fixture(scope="module")
def verifier(tiny_dir):
    target, st = serve(tiny_dir("qwen3"))
    yield target, st
    st.stop()


def run(bundle, where, token_file, *extra):
    return main(
        [
            "run",
            str(bundle),
            "--server",
            where,
            "--token-file",
            token_file,
            "--prompt-ids",
            ",".join(map(str, PROMPT)),
            *extra,
        ]
    )


def resign(src, dst, edit):
    """A copy of `src` whose edge.json `edit` changed, with a manifest that hashes it again
    (as a packager would have written it)."""
    shutil.copytree(src, dst)
    edge = json.loads((dst / "edge.json").read_text())
    edit(edge)
    (dst / "edge.json").write_text(json.dumps(edge))
    m = json.loads((dst / "manifest.json").read_text())
    body = {k: v for k, v in m.items() if k not in ("format", "format_version", "files")}
    write_manifest(dst, body | {"edge": edge})
    return dst


def test_manifest_records_the_edge_side(bundle, tiny_dir):
    m = verify_bundle(bundle)
    assert {"edge.json", "profile.toml"} <= set(m["files"])  # hashed like every file
    e = m["edge"]
    assert e["wire_version"] == wire.VERSION
    assert e["codec"] == {
        "name": "ids",
        "number": 1,
        "carries_q": False,
        "lossy": False,
        "params": {"bits_per_id": 9},
    }
    assert e["profile"]["name"] == "snapdragon-8-gen-3"
    assert e["profile"]["flexspec"]["alpha_edge"] == pytest.approx(0.0105)
    assert m["pairs_with"]["base"] == target_identity(tiny_dir("qwen3"))["base"]
    assert e["claim"]["vocab_hash"] == m["tokenizer"]["vocab_hash"]
    assert not any(f.startswith("draft.mlpackage") for f in m["files"])  # ONNX only


def test_bundle_generates_through_the_verifier_equal_to_ar(bundle, verifier, token_file, capsys):
    target, st = verifier
    n = 14  # 6 + 14 > the draft's 16 slots: the last rounds send K = 0
    assert run(bundle, f"{st.host}:{st.port}", token_file, "--max-tokens", str(n), "--json") == 0
    r = json.loads(capsys.readouterr().out)
    assert r["tokens"] == ar_tokens(target, PROMPT, n)
    e = r["stats"]["edge"]
    assert sum(e["accepted"]) > 0 and e["k"][-1] == 0  # drafts accepted, then past the context
    assert r["stats"]["profile"] == "snapdragon-8-gen-3" and r["stats"]["codec"] == "ids"
    # the text mode: the text, then one line per round and a summary on stderr
    assert run(bundle, f"{st.host}:{st.port}", token_file, "--max-tokens", "4", "--k", "2") == 0
    err = capsys.readouterr().err
    assert "round" in err and "codec ids" in err and "fixed 2" in err


def test_raw_codec_bundle_equal_to_ar(bundle, verifier, token_file, tmp_path, capsys):
    target, st = verifier

    def to_raw(edge):
        edge["codec"] |= {"name": "raw", "number": 2, "carries_q": True}
        edge["claim"]["codec"] = "raw"

    raw = resign(bundle, tmp_path / "raw", to_raw)
    assert (
        run(raw, f"{st.host}:{st.port}", token_file, "--max-tokens", "8", "--k", "3", "--json") == 0
    )
    r = json.loads(capsys.readouterr().out)
    assert r["tokens"] == ar_tokens(target, PROMPT, 8) and r["stats"]["codec"] == "raw"
    assert min(r["stats"]["edge"]["bytes_up"]) > 4 * 320  # q rows crossed the wire


def test_compressed_codec_bundle_uses_its_recorded_parameters(
    bundle, verifier, token_file, tmp_path, capsys
):
    """A k-sqs bundle: the client builds its encoder from the parameters edge.json records."""
    from apps.companion.edge_side import codec_record

    target, st = verifier

    def to_ksqs(edge):
        edge["codec"] = codec_record("k-sqs", 320) | {"params": {"k": 16, "ell": 64}}
        edge["claim"]["codec"] = "k-sqs"

    ksqs = resign(bundle, tmp_path / "ksqs", to_ksqs)
    assert (
        run(ksqs, f"{st.host}:{st.port}", token_file, "--max-tokens", "8", "--k", "3", "--json")
        == 0
    )
    r = json.loads(capsys.readouterr().out)
    assert r["tokens"] == ar_tokens(target, PROMPT, 8) and r["stats"]["codec"] == "k-sqs"
    assert max(r["stats"]["edge"]["bytes_up"]) < 4 * 320  # compressed: far below raw's q rows


@pytest.mark.parametrize(
    "other, match",
    [({"vocab_size": 330}, "vocabulary of 320"), ({"num_layers": 2}, "built for base")],
)
def test_bundle_for_another_vocabulary_or_base_refused_at_hello(
    bundle, tiny_dir, token_file, capsys, other, match
):
    _, st = serve(tiny_dir("qwen3", **other))
    capsys.readouterr()  # (making the checkpoint printed progress)
    try:
        assert run(bundle, f"{st.host}:{st.port}", token_file, "--max-tokens", "2") == 2
    finally:
        st.stop()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and match in err and "refused HELLO" in err, err


def test_claims_the_verifier_cannot_verify(bundle, verifier, tiny_dir):
    _, st = verifier
    claim = json.loads((bundle / "edge.json").read_text())["claim"]
    bad = [({"wire_version": 2}, wire.E_VERSION), ({"codec": "zstd"}, wire.E_CODEC),
           ({"vocab_hash": "0" * 64}, wire.E_VOCAB)]  # fmt: skip
    for change, code in bad:
        with pytest.raises(CloudError, match=f"error {code}"):
            Connection(st.host, st.port, TOKEN, claim=claim | change)
    # a claim without a base is checked on the vocabulary only; no claim is version 1's HELLO
    for c in (claim | {"base": None}, None):
        Connection(st.host, st.port, TOKEN, claim=c).close()
    # a verifier that knows no tokenizer for its target cannot check a claim
    st2 = ServerThread(st.server.target, token=TOKEN)
    try:
        with pytest.raises(CloudError, match=f"no tokenizer.*error {wire.E_VOCAB}"):
            Connection(st2.host, st2.port, TOKEN, claim=claim)
    finally:
        st2.stop()


@pytest.mark.parametrize("name", ["profile.toml", "edge.json"])
def test_tampered_profile_or_codec_refused_before_any_connection(
    bundle, token_file, tmp_path, capsys, name
):
    copy = tmp_path / "b"
    shutil.copytree(bundle, copy)
    p = copy / name
    p.write_text(p.read_text().replace("0.0105", "0.0001").replace('"ids"', '"raw"'))
    listener = socket.create_server(("127.0.0.1", 0))  # listens, never accepts
    listener.setblocking(False)
    try:
        port = listener.getsockname()[1]
        assert run(copy, f"127.0.0.1:{port}", token_file, "--max-tokens", "2") == 2
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    finally:
        listener.close()
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{name} does not match its sha256" in err, err


def test_bad_package_and_run_flags_are_one_line(bundle, tiny_dir, tmp_path, capsys):
    d = str(tiny_dir("qwen3"))
    capsys.readouterr()
    for argv, match in [
        (["package", "--draft", d, "--out", str(tmp_path / "o"), "--codec", "zstd"], "codec"),
        (["package", "--draft", d, "--out", str(tmp_path / "o"), "--profile", "nope"], "nope"),
        (["run", str(bundle), "--prompt", "hi", "--server", "nohost"], "HOST:PORT"),
        (["run", str(bundle), "--prompt", "hi", "--link", "4g"], "need --server"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and match in err, err
