"""The shared-memory lane."""
