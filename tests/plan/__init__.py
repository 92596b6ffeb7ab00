"""The planner: the pure decision and its models, and the planner inside a running client."""
