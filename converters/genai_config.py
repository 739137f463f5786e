"""A `genai_config.json`-style description written beside a static-shape ONNX export.

It follows onnxruntime-genai's layout (model.decoder: filenames, head counts,
input/output name templates; search: max_length) so its tooling and a mobile
app can read one file to drive the graphs. Fields genai has no name for live
under "duet" (graph query lengths, the cache protocol, quantization).
"""

from __future__ import annotations

import json
from pathlib import Path

from runtime.config import ModelConfig

FILENAME = "genai_config.json"


def genai_decoder(cfg: ModelConfig, filename: str, session_options: dict) -> dict:
    """genai_config.json's `model.decoder`: the graph file, shapes and our I/O names."""
    return {
        "filename": filename,
        "head_size": cfg.head_dim,
        "hidden_size": cfg.hidden_size,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "num_hidden_layers": cfg.num_layers,
        "inputs": {
            "input_ids": "input_ids",
            "attention_mask": "attention_mask",
            "position_ids": "position_ids",
            "past_key_names": "past_key_values.%d.key",
            "past_value_names": "past_key_values.%d.value",
        },
        "outputs": {
            "logits": "logits",
            "present_key_names": "present.%d.key",
            "present_value_names": "present.%d.value",
        },
        "session_options": session_options,
    }


def genai_config(
    cfg: ModelConfig,
    files: dict[str, str],
    context: int,
    prefill_len: int,
    quantization: str,
    provider: str = "qnn",
) -> dict:
    """The description of a static export whose graph files (relative names) are `files`."""
    eos = list(cfg.eos_token_ids)
    return {
        "model": {
            "type": cfg.model_type,
            "vocab_size": cfg.vocab_size,
            "context_length": context,
            "eos_token_id": (eos[0] if len(eos) == 1 else eos) if eos else None,
            "pad_token_id": eos[0] if eos else 0,
            "decoder": genai_decoder(
                cfg,
                files["decode"],
                # genai runs the CPU provider when none is named
                {"provider_options": [] if provider == "cpu" else [{provider: {}}]},
            ),
        },
        "search": {"max_length": context, "do_sample": False, "past_present_share_buffer": False},
        "duet": {
            "static_shapes": True,
            "graphs": {
                "decode": {"filename": files["decode"], "query_len": 1},
                "prefill": {"filename": files["prefill"], "query_len": prefill_len},
            },
            "cache_protocol": (
                "past (1, KV, C, D) holds C slots; attention_mask (1, C + T) marks live slots "
                "then the T new tokens; present (1, KV, T, D) holds only the new rows, which the "
                "host writes into slots [offset, offset + T); pad the last prefill chunk"
            ),
            "quantization": quantization,
        },
    }


def write_genai_config(
    decode_path: str | Path,
    cfg: ModelConfig,
    context: int,
    prefill_len: int,
    quantization: str,
    provider: str = "qnn",
) -> Path:
    """Write genai_config.json beside the export's decode graph; returns its path."""
    from converters.onnx_static import graph_paths

    paths = graph_paths(decode_path)
    files = {k: p.name for k, p in paths.items()}
    out = paths["decode"].parent / FILENAME
    out.write_text(
        json.dumps(genai_config(cfg, files, context, prefill_len, quantization, provider), indent=2)
        + "\n"
    )
    return out
