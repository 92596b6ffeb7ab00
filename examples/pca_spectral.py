"""PCA of a synthetic low-rank-plus-noise dataset, computed two ways.

The data are n_samples = 2*n points in n dimensions (1024 by default) drawn
from a spiked covariance model: a handful of strong latent directions plus
isotropic noise.  Principal components are obtained

  1. from the thin SVD of the centred data matrix (np.linalg.svd), and
  2. from eigh of the sample covariance (built with np.einsum and, as a
     cross-check, np.tensordot),

and a whitening transform built with np.linalg.inv is verified.

Usage: python examples/pca_spectral.py [n_features]   (default 1024)
"""

import sys

import numpy as np


def main():
    n_features = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    n_samples = 2 * n_features
    spike_vars = np.array([60.0, 35.0, 20.0, 12.0, 7.0, 4.0])
    n_latent = spike_vars.size
    noise_var = 1.0

    rng = np.random.default_rng(7)

    # Random orthonormal latent directions (QR of a Gaussian matrix).
    basis, _ = np.linalg.qr(rng.standard_normal((n_features, n_latent)))
    latent = rng.standard_normal((n_samples, n_latent)) * np.sqrt(spike_vars)
    X = np.matmul(latent, basis.T)
    X += np.sqrt(noise_var) * rng.standard_normal((n_samples, n_features))
    X += rng.normal(0.0, 3.0, size=n_features)          # non-zero feature means

    Xc = X - X.mean(axis=0)

    # --- PCA via SVD of the centred data -----------------------------------
    U, s, Vt = np.linalg.svd(Xc, full_matrices=False)
    eig_svd = s**2 / (n_samples - 1)

    # --- PCA via eigh of the covariance ------------------------------------
    C = np.einsum("ki,kj->ij", Xc, Xc, optimize=True) / (n_samples - 1)
    C_td = np.tensordot(Xc, Xc, axes=([0], [0])) / (n_samples - 1)
    cov_agree = np.max(np.abs(C - C_td)) / np.max(np.abs(C))
    C = 0.5 * (C + C.T)
    evals, evecs = np.linalg.eigh(C)
    evals, evecs = evals[::-1], evecs[:, ::-1]          # descending order

    ratio = evals / evals.sum()
    eig_agree = np.max(np.abs(evals - eig_svd)) / evals[0]

    # Subspace agreement of the leading components (sign-independent):
    # singular values of V_svd^T V_eigh are cosines of the principal angles.
    overlap = np.matmul(Vt[:n_latent], evecs[:, :n_latent])
    cosines = np.linalg.svd(overlap, compute_uv=False)
    subspace_agree = 1.0 - cosines.min()

    # Recovery of the planted directions.
    recov = np.linalg.svd(np.dot(basis.T, evecs[:, :n_latent]), compute_uv=False)

    # Components above the Marchenko-Pastur noise edge.
    mp_edge = noise_var * (1.0 + np.sqrt(n_features / n_samples)) ** 2
    n_signal = int(np.sum(evals > mp_edge))

    # --- Whitening with the inverse square root of the covariance ----------
    inv_sqrt = np.matmul(evecs / np.sqrt(evals), evecs.T)  # C^{-1/2}
    C_inv = np.linalg.inv(C)
    inv_agree = (np.max(np.abs(np.matmul(inv_sqrt, inv_sqrt) - C_inv))
                 / np.max(np.abs(C_inv)))
    W = np.matmul(Xc, inv_sqrt)
    C_white = np.tensordot(W, W, axes=([0], [0])) / (n_samples - 1)
    white_err = np.max(np.abs(C_white - np.eye(n_features)))

    print(f"data: {n_samples} samples x {n_features} features, "
          f"{n_latent} planted components")
    print("explained variance ratio (top 8):")
    for k in range(8):
        print(f"  PC{k + 1}: {ratio[k]:.6f}")
    print(f"cumulative ratio of top {n_latent}: {ratio[:n_latent].sum():.6f}")
    print(f"leading eigenvalue: {evals[0]:.6g}")
    print(f"components above MP noise edge ({mp_edge:.4f}): {n_signal}")
    print(f"min cosine to planted subspace: {recov.min():.6f}")
    print(f"einsum vs tensordot covariance agree: {bool(cov_agree < 1e-12)}")
    print(f"svd vs eigh eigenvalues agree: {bool(eig_agree < 1e-10)}")
    print(f"svd vs eigh subspaces agree: {bool(subspace_agree < 1e-10)}")
    print(f"inv(C) == C^-1/2 C^-1/2: {bool(inv_agree < 1e-8)}")
    print(f"whitened covariance is identity: {bool(white_err < 1e-8)}")


if __name__ == "__main__":
    main()
