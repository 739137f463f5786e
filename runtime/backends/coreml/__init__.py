"""The Core ML backend: a draft `.mlpackage` from `converters` on the Neural Engine.

causal_lm  CoreMLCausalLM: the CausalLM protocol over the package (predicts on macOS 15 only)
spec       what a package declares, read from its spec (any OS)

No family table: converters/coreml_model.py writes one graph layout for the families it
converts, and the package declares its own inputs, so loading reads no model_type.
"""
