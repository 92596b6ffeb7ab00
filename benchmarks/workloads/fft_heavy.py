"""FFT-heavy signal processing: 2-d transforms of complex images and long real transforms."""
import numpy as np

DESCRIPTION = "6 x (fft2 + ifft2) of c16 768^2, 2 x (rfft + irfft) of f8 2^21"


def setup():
    rng = np.random.default_rng(4)
    return {"img": rng.standard_normal((768, 768)) + 1j * rng.standard_normal((768, 768)),
            "sig": rng.standard_normal(1 << 21)}


def run(data):
    img, sig = data["img"], data["sig"]
    kernel = np.exp(-np.linspace(0, 4, 768)) [None, :]
    total = 0.0
    for _ in range(6):
        spec = np.fft.fft2(img)
        img = np.fft.ifft2(spec * kernel)
        total += float(abs(img[0, 0]))
    for _ in range(2):
        s = np.fft.rfft(sig)
        sig = np.fft.irfft(s * 0.5, n=sig.size)
        total += float(sig[0])
    return total
