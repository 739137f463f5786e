"""The companion mobile app's edge side: `package` builds a bundle (draft for the phone's
NPU as .mlpackage and .onnx, tokenizer, manifest), `run` is the reference client."""
