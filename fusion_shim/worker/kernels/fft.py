"""numpy.fft: one- and n-dimensional transforms through torch.fft (the same sizes, axes and norms)."""
from __future__ import annotations

import torch

from .common import Kernel

FFT1 = {"fft": torch.fft.fft, "ifft": torch.fft.ifft, "rfft": torch.fft.rfft, "irfft": torch.fft.irfft,
        "hfft": torch.fft.hfft, "ihfft": torch.fft.ihfft}
FFTN = {"fft": torch.fft.fftn, "ifft": torch.fft.ifftn, "rfft": torch.fft.rfftn, "irfft": torch.fft.irfftn}


def _fft1(t: list, p: dict) -> list:
    return [FFT1[p["kind"]](t[0], n=p["n"], dim=p["axis"], norm=p["norm"])]


def _fftn(t: list, p: dict) -> list:
    return [FFTN[p["kind"]](t[0], s=p["s"], dim=p["axes"], norm=p["norm"])]


KERNELS: dict[str, Kernel] = {
    "fft.fft1": _fft1,
    "fft.fftn": _fftn,
}
