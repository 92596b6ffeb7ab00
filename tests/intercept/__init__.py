"""The interceptor: what it wraps and puts back, the operators, the launcher."""
