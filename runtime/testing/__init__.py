"""Random checkpoints and tokenizers for tests, demos and benches: tiny models from small
configs (Llama-style, Gemma 3, hybrid Qwen3.5) and a byte-level tokenizer, made on the fly.
Nothing here is loaded by the engine's decoding path."""
