"""The wire format, and a live worker fed mutated messages."""
