"""The differential table through the shared-memory lane (issue 9): every buffer of every case in
shared memory (``MIN_BYTES = 0``), none on the socket, against the in-process worker; same checks as
tests/catalog/test_differential.py, plus where the bytes went.
"""
from __future__ import annotations

import numpy as np
import pytest

import fusion_shim
from fusion_shim.transport import shm, shm_client

from tests.catalog import test_differential as diff
from tests.helpers.shims import CALL_TIMEOUT_S, install  # its table, builders and checks

pytestmark = pytest.mark.skipif(not shm.available(), reason="no /dev/shm on this machine")


# --- the differential table through shared memory ------------------------------------------------------

@pytest.fixture(scope="module")
def shm_shim(inproc_worker):
    old, shm_client.MIN_BYTES = shm_client.MIN_BYTES, 0  # every buffer through shared memory, even 8 bytes
    rt = install(inproc_worker, timeout=CALL_TIMEOUT_S)
    assert rt.link.shm() is not None, f"shared memory was not negotiated: {rt.ledger.events}"
    yield rt
    fusion_shim.uninstall()
    shm_client.MIN_BYTES = old


def _sent_as_is(x: np.ndarray) -> bool:
    return x.dtype.isnative and (x.flags.c_contiguous or x.flags.f_contiguous)


@pytest.mark.parametrize("case,dtype,layout", list(diff._params()))
def test_differential_through_shm(shm_shim, case, dtype, layout):
    shm_shim.ledger.clear()
    a_args, kwargs = case.build(diff.Maker(dtype, layout))
    exp, got, rec = diff.run_both(shm_shim, case.op, a_args, kwargs)
    assert rec.kind == "worker", f"{case.op} ran {rec.kind}: {rec.reason}"
    diff.check_result(case.check, case.size, a_args, kwargs, got, exp)
    # one passed twice is placed once (D202); one the wire copies (strided, byte-swapped) is copied each time
    inputs = {(x.ctypes.data, x.nbytes) if _sent_as_is(x) else object(): x
              for x in (*a_args, *kwargs.values()) if isinstance(x, np.ndarray)}
    expected = sum(x.nbytes for x in inputs.values())
    if any(type(x) in (list, tuple) for x in (*a_args, *kwargs.values())):  # array-likes, converted: more
        assert rec.shm_sent >= expected, "an input did not go through shared memory"
    else:
        assert rec.shm_sent == expected, "an input did not go through shared memory"
    assert rec.shm_received > 0 and rec.bytes_sent < 4096, (rec.shm_received, rec.bytes_sent)  # headers only
