"""The catalog: its rows against the real signatures, and every row offloaded against the library itself."""
