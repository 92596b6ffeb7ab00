"""Faults: what each costs, never an exception or a wrong answer, and where it shows."""
