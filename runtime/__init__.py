"""Duet's engine. From Python: `from runtime import load, generate, stream_generate`
(runtime/api.py; imported on first use, so `import runtime.x` stays light)."""

__all__ = ["load", "generate", "stream_generate"]


def __getattr__(name: str):
    if name in __all__:
        from runtime import api

        return getattr(api, name)
    raise AttributeError(f"module 'runtime' has no attribute {name!r}")
