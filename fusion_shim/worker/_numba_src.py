"""The numba.cuda kernel sources, imported only where numba can run them
(:func:`fusion_shim.worker.numba_kernels.numba_mode`). ``cuda`` must be a module global: under
``NUMBA_ENABLE_CUDASIM=1`` the simulator replaces the global it finds in a kernel's module."""
from numba import cuda


@cuda.jit
def bincount(x, out):
    # a bin outside [0, n) is never written (the client computed n = max(x) + 1; a malformed call
    # must not write past the output)
    i = cuda.grid(1)
    if i < x.shape[0] and 0 <= x[i] < out.shape[0]:
        cuda.atomic.add(out, x[i], 1)


@cuda.jit
def bincount_weighted(x, w, out):
    i = cuda.grid(1)
    if i < x.shape[0] and i < w.shape[0] and 0 <= x[i] < out.shape[0]:
        cuda.atomic.add(out, x[i], w[i])


@cuda.jit
def correlate(x, y, out, n_left):
    # NumPy's _pyarray_correlate: out[i] = sum_j x[i - n_left + j] * y[j], over the overlap
    i = cuda.grid(1)
    if i < out.shape[0]:
        start = i - n_left
        lo = max(0, -start)
        hi = min(y.shape[0], x.shape[0] - start)
        acc = out[i]  # zero, in the result dtype: NumPy accumulates in it too
        for j in range(lo, hi):
            acc += x[start + j] * y[j]
        out[i] = acc


@cuda.jit
def interp(x, xp, fp, out, left, right):
    # NumPy's arr_interp for one real component: bounds, exact last point, bisection, then the
    # slope formula with its two NaN fix-ups
    i = cuda.grid(1)
    if i < x.shape[0]:
        v = x[i]
        n = xp.shape[0]
        if v > xp[n - 1]:
            out[i] = right
        elif v < xp[0]:
            out[i] = left
        elif v == xp[n - 1]:
            out[i] = fp[n - 1]
        else:
            lo, hi = 0, n - 1  # xp[lo] <= v < xp[hi]
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if xp[mid] <= v:
                    lo = mid
                else:
                    hi = mid
            slope = (fp[lo + 1] - fp[lo]) / (xp[lo + 1] - xp[lo])
            r = slope * (v - xp[lo]) + fp[lo]
            if r != r:
                r = slope * (v - xp[lo + 1]) + fp[lo + 1]
                if r != r and fp[lo] == fp[lo + 1]:
                    r = fp[lo]
            out[i] = r
