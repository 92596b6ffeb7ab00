"""numpy.fft: one- and n-dimensional transforms through torch.fft (the same sizes, axes and norms); scipy.fft's
dct and dst (types 1-4) through one complex FFT of twice the length."""
from __future__ import annotations

import math

import torch

from .common import Kernel

FFT1 = {"fft": torch.fft.fft, "ifft": torch.fft.ifft, "rfft": torch.fft.rfft, "irfft": torch.fft.irfft,
        "hfft": torch.fft.hfft, "ihfft": torch.fft.ihfft}
FFTN = {"fft": torch.fft.fftn, "ifft": torch.fft.ifftn, "rfft": torch.fft.rfftn, "irfft": torch.fft.irfftn}


def _fft1(t: list, p: dict) -> list:
    return [FFT1[p["kind"]](t[0], n=p["n"], dim=p["axis"], norm=p["norm"])]


def _fftn(t: list, p: dict) -> list:
    return [FFTN[p["kind"]](t[0], s=p["s"], dim=p["axes"], norm=p["norm"])]




# --- scipy.fft's real-to-real transforms (dct, dst; their inverses arrive as the inverse type) --------

def _twiddle(k: "torch.Tensor", num: float, den: int, cdt: torch.dtype) -> "torch.Tensor":
    """exp(-i pi num k / den) in ``cdt``."""
    return torch.polar(torch.ones_like(k), -math.pi * num * k / den).to(cdt)


def _r2r_unnormalized(x: "torch.Tensor", kind: str, typ: int) -> tuple["torch.Tensor", int]:
    """D264: SciPy's unnormalized DCT/DST of the last axis through one complex FFT of twice the length
    (the even or odd extension's), and the transform's normalizing length (2(N-1), 2(N+1) or 2N)."""
    n = x.shape[-1]
    cdt = torch.complex64 if x.dtype == torch.float32 else torch.complex128
    k = torch.arange(n, dtype=x.dtype, device=x.device)
    if typ == 1:
        if kind == "dct":  # y[k] = x0 + (-1)^k x[N-1] + 2 sum x[n] cos(pi k n / (N-1))
            w = torch.full((n,), 2.0, dtype=x.dtype, device=x.device)
            w[0] = w[-1] = 1.0
            return torch.fft.fft(x * w, n=2 * (n - 1)).real[..., :n], 2 * (n - 1)
        z = torch.nn.functional.pad(x, (1, 0))  # y[k] = 2 sum x[n] sin(pi (k+1)(n+1) / (N+1))
        return -2 * torch.fft.fft(z, n=2 * (n + 1)).imag[..., 1:n + 1], 2 * (n + 1)
    if typ == 2:
        f = torch.fft.fft(x, n=2 * n)
        if kind == "dct":
            return 2 * (_twiddle(k, 1, 2 * n, cdt) * f[..., :n]).real, 2 * n
        return -2 * (_twiddle(k + 1, 1, 2 * n, cdt) * f[..., 1:n + 1]).imag, 2 * n
    if typ == 3:
        w = torch.full((n,), 2.0, dtype=x.dtype, device=x.device)
        if kind == "dct":
            w[0] = 1.0
            return torch.fft.fft(x * w * _twiddle(k, 1, 2 * n, cdt), n=2 * n).real[..., :n], 2 * n
        w[-1] = 1.0
        z = torch.nn.functional.pad(x * w * _twiddle(k + 1, 1, 2 * n, cdt), (1, 0))
        return -torch.fft.fft(z, n=2 * n).imag[..., :n], 2 * n
    f = torch.fft.fft(x * _twiddle(k, 1, 2 * n, cdt), n=2 * n)[..., :n] * _twiddle(2 * k + 1, 1, 4 * n, cdt)
    return 2 * (f.real if kind == "dct" else -f.imag), 2 * n


def _r2r(t: list, p: dict) -> list:
    """dct/dst of ``type`` 1-4 along ``axis``, cut or zero-padded to ``n``, with SciPy's norms
    (orthogonalized under "ortho": the end terms' extra sqrt(2) factors)."""
    kind, typ, norm, n = p["kind"], p["type"], p["norm"], p["n"]
    x = t[0].movedim(p["axis"], -1)
    if x.shape[-1] > n:
        x = x[..., :n]
    elif x.shape[-1] < n:
        x = torch.nn.functional.pad(x, (0, n - x.shape[-1]))
    ortho = norm == "ortho"
    end = 0 if kind == "dct" else -1  # the term DCT-III / DST-III weigh differently, and II's output
    if ortho and (typ == 3 or (typ == 1 and kind == "dct")):
        x = x.clone()
        x[..., end] *= math.sqrt(2)
        if typ == 1:
            x[..., -1] *= math.sqrt(2)
    y, length = _r2r_unnormalized(x, kind, typ)
    if norm == "forward":
        y = y / length
    elif ortho:
        y = y * math.sqrt(1.0 / length)
        if typ == 2 or (typ == 1 and kind == "dct"):
            y[..., end] /= math.sqrt(2)
            if typ == 1:
                y[..., -1] /= math.sqrt(2)
    return [y.movedim(-1, p["axis"]).contiguous()]


KERNELS: dict[str, Kernel] = {
    "fft.fft1": _fft1,
    "fft.fftn": _fftn,
    "fft.r2r": _r2r,
}
