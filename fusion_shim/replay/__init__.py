"""Replay a recorded run (``--report run.json``) on a modelled device and link: what all-local,
all-remote, ``auto`` (the real planner on a simulated clock) and the oracle would take. Everything
it shows is SIMULATED.

- :mod:`.hardware`: device and link models as data (datasheet figures, ASSUMED efficiency curves),
  this host's CPU worker from its self-benchmark, the measured loopback link; a user's TOML.
- :mod:`.simulate`: the recorded calls as steps, the four strategies, the comparison.
- :mod:`.command`: ``fusion-shim replay``.

May import plan/ and catalog/; nothing below it imports it.
"""
