"""A tiny llama GGUF written from a tiny random checkpoint, the way llama.cpp's converter lays
one out (tensor names, q/k rows permuted for its RoPE, a gpt2-style byte tokenizer), so the
GGUF import can be tested offline against the checkpoint it came from."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (convert_hf_to_gguf's `permute`): halves interleaved per head."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def write_llama_gguf(
    ckpt: Path, out: Path, *, arch: str = "llama", chat_template: str | None = None
) -> Path:
    """Write `ckpt` (a tiny llama checkpoint with a byte tokenizer) as an F32 GGUF at `out`.
    `arch` is written as general.architecture as given (a wrong one tests the refusal)."""
    import gguf
    from safetensors.numpy import load_file

    cfg = json.loads((ckpt / "config.json").read_text())
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    state = load_file(str(ckpt / "model.safetensors"))
    h, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    w = gguf.GGUFWriter(str(out), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(h)
    w.add_head_count_kv(kv)
    w.add_rope_freq_base(
        float(cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta", 10000.0)))
    )
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_vocab_size(cfg["vocab_size"])
    w.add_rope_dimension_count(cfg["hidden_size"] // h)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    vocab = {**tok["model"]["vocab"], **{t["content"]: t["id"] for t in tok["added_tokens"]}}
    tokens = [None] * cfg["vocab_size"]
    for s, i in vocab.items():
        if i < len(tokens):
            tokens[i] = s
    special = {t["id"] for t in tok["added_tokens"]}
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if i in special else 1 for i in range(len(tokens))])
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_merges([])
    w.add_bos_token_id(vocab["<|im_start|>"])
    w.add_eos_token_id(vocab["<|im_end|>"])
    w.add_add_bos_token(False)
    if chat_template:
        w.add_chat_template(chat_template)
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down"}  # fmt: skip
    for k, v in state.items():
        v = v.astype(np.float32)
        if k == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif k == "model.norm.weight":
            name = "output_norm.weight"
        elif k == "lm_head.weight":
            name = "output.weight"
        else:
            i, rest = k.split(".")[2], ".".join(k.split(".")[3:]).removesuffix(".weight")
            name = f"blk.{i}.{names[rest]}.weight"
            if rest == "self_attn.q_proj":
                v = _permute(v, h)
            elif rest == "self_attn.k_proj":
                v = _permute(v, kv)
        w.add_tensor(name, np.ascontiguousarray(v))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
