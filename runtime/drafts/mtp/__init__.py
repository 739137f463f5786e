"""`--draft mtp`: a target's multi-token-prediction head (`mtp.*` weights) as the draft.

weights  where the `mtp.*` tensors are found (the checkpoint's own, else a fitted file)
torch    the head in PyTorch
onnx     its step in ONNX Runtime, on a CPU target
"""
