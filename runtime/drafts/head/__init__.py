"""`--draft head`: a feature-level head fitted to the target (EAGLE-3, FR-Spec's vocabulary).

torch  the head in PyTorch (the reference, training's model)
onnx   its step in ONNX Runtime, beside a CPU target
"""
