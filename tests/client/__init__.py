"""The client side: residency, configuration, the report."""
