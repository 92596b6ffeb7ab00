"""The package as built and shipped: one-way imports, the C extension, the examples."""
