import numpy as np

from tests.helpers.shims import last_record


def test_matmul_goes_to_worker(shim):
    a = np.arange(12.0).reshape(3, 4)
    b = np.arange(8.0).reshape(4, 2)
    got = np.matmul(a, b)
    rec = last_record(shim)
    assert rec.kind == "worker", rec
    np.testing.assert_allclose(got, a.dot(b))
