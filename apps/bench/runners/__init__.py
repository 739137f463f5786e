"""Runners: what `python -m apps.bench` times, Duet's methods and its peers alike.

A runner has `name`, `settings()` and `generate(ids, max_new, temp, top_p, seed) -> TurnResult`
(turn.py); the schedule (apps/bench/schedule.py) alternates them per prompt.

turn.py             what every runner returns for one turn (TurnResult), and a refusal
duet.py             Duet's methods (any name in runtime.decoding.METHODS) and `auto`
hf.py               Hugging Face assisted generation (`assistant_model=`) at a fixed γ; `hf` alone
mlx_lm.py           mlx-lm's `speculative_generate_step` on the same pair and γ
peers.py            `--peers`: other runtimes on the same model, each with its own `ar`
llamacpp.py         the `llama.cpp:*` peer rows over llama-server
llamacpp_server.py  llama-server itself: built once into the cache, started and stopped
ort_genai.py        the `ort-genai:*` peer rows (onnxruntime-genai on its own int4 build)
hf_lookup.py        the `hf:*` peer rows (HF generate alone and with prompt lookup)
"""
