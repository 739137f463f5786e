"""flexspec on hybrid (Qwen3.5) models: the cloud verifier holds a hybrid target and rolls its
HybridCache back to the committed prefix after every verdict (FlexSpec §IV-C); the edge's
hybrid draft (torch by replay, ONNX by its kept per-position states) is trimmed likewise.
Greedy tokens equal `ar`'s and Hugging Face `generate`'s, with windows that accept none,
some and all of their drafts."""

import numpy as np
import pytest
import torch
from edge_helpers import ar_tokens, flexspec
from test_hybrid import near_copy

from devices.kstar import AdaptiveK
from runtime.backends import load_model
from runtime.edge.client import Connection

PROMPT = [5, 17, 42, 99, 7, 256, 3]
N = 20


@pytest.fixture(scope="module")
def hybrid(tiny_dir):
    from transformers import AutoModelForCausalLM

    tdir = tiny_dir("qwen3_5_text", seed=1)
    hf = AutoModelForCausalLM.from_pretrained(tdir).eval()
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([PROMPT]), max_new_tokens=N, do_sample=False, min_new_tokens=N
        )
    return {
        "dir": tdir,
        "target": load_model(tdir, "torch", threads=1),
        "hf_greedy": out[0, len(PROMPT) :].tolist(),
    }


@pytest.mark.parametrize("draft", ["hybrid_torch", "hybrid_onnx", "attention", "near_copy"])
def test_greedy_flexspec_on_a_hybrid_target_equals_ar_and_hf(hybrid, tiny_dir, verifier, draft):
    d2 = tiny_dir("qwen3_5_text", num_layers=2, seed=2)
    drafts = {
        "hybrid_torch": lambda: load_model(d2, "torch", threads=1),
        "hybrid_onnx": lambda: load_model(d2, "onnx"),
        "attention": lambda: load_model(tiny_dir("qwen3", num_layers=1, seed=3), "onnx"),
        "near_copy": lambda: near_copy(hybrid["dir"]),
    }
    target, d = hybrid["target"], drafts[draft]()
    ref = ar_tokens(target, PROMPT, N)
    assert ref == hybrid["hf_greedy"]
    st = verifier(target)
    conn = Connection(st.host, st.port)
    for opts in ({"k": 3}, {"controller": AdaptiveK()}):
        r = flexspec(conn, d, PROMPT, N, **opts)
        assert r.tokens == ref, opts
        if draft == "near_copy" and "k" in opts:  # rollback on both sides: rejections, full windows
            lens = np.array(r.stats.accept_lengths)
            assert (lens < lens.max()).any() and lens.max() >= 4, lens
    conn.close()
    assert st.open_sessions() == 0
