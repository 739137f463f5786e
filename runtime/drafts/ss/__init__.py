"""Speculative-streaming (SS) drafts (Mirror-SD §3.2): a small model that drafts several tokens
per pass through stream embeddings. How a window is drafted: runtime/decoding/ss_draft.py.

checkpoint  an SS draft directory: a Hugging Face checkpoint plus its stream embeddings
torch       the SS draft on PyTorch
onnx        the SS draft on ONNX Runtime
"""
