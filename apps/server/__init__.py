"""`python -m apps.server`: an OpenAI-compatible HTTP server over the engine (see __main__.py)."""
