"""The end-of-run report's layout: the default table in 100 columns, --full, --explain, and the categories each call is counted in."""
