"""The edge side of edge-cloud speculative decoding: the wire format, its payload codecs and the
client that drafts here and asks a cloud verifier (apps.cloud) to check. See PROTOCOL.md."""
