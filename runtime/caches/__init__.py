"""Every cache a model runs against, and its rollback: one object per model holding each
layer's state, with the informal interface `offset`, `trim`, `fork` / `select` for branch rows.

concat       ConcatKVCache: keys and values as host arrays (torch or NumPy), trim moves an offset
layer_offsets LayerOffsets: the per-layer offsets, trim and compact concat and buffer share
buffer       BufferKVCache: preallocated NumPy buffers the ONNX target writes in place
sliding      SlidingKVCache: Gemma 3's local sliding-window layers beside global ones
hybrid       HybridCache: KV for full attention, Gated DeltaNet states, exact rollback (torch)
linear_state LinearLayerState: one linear-attention layer's states, log and kept states
step_state   StepStateCache: a one-token-per-call hybrid graph's states per recent position
mlx_kv       MLXKVCache: MLX's preallocated per-layer buffers
mlx_hybrid   MLXHybridCache: HybridCache's bookkeeping over MLX arrays
slots        OneRowSlots: a fixed-slot batch-1 cache's offset (the Core ML and static ONNX drafts)
"""
