"""The cloud verifier: `python -m apps.cloud serve` (server.py) holding one KV-cache session per
client (session.py), speaking runtime/edge/PROTOCOL.md."""
