"""Installing the shim for a test, and reading what it recorded."""
from __future__ import annotations


def last_record(rt):
    assert rt.ledger.records, "no call was recorded"
    return rt.ledger.records[-1]
