"""Least-squares regression via normal equations (Cholesky) cross-checked with QR.

A synthetic regression problem with a well-conditioned design matrix: a few
low-degree Legendre polynomial columns plus many Gaussian random features, and
several independent response vectors.  The coefficients are estimated by

  1. forming the Gram matrix G = X^T X and solving G b = X^T y with a Cholesky
     factor (np.linalg.cholesky + np.linalg.solve), and
  2. a thin QR factorisation of X (np.linalg.qr + np.linalg.solve),

and the two solutions are compared.

Usage: python examples/lstsq_fit.py [n_features]   (default 1024; 2*n samples)
"""

import sys

import numpy as np


def legendre_columns(t, degree):
    """Legendre polynomials P_0..P_degree evaluated at t (three-term recurrence)."""
    cols = [np.ones_like(t), t.copy()]
    for k in range(1, degree):
        cols.append(((2 * k + 1) * t * cols[k] - k * cols[k - 1]) / (k + 1))
    return np.stack(cols[: degree + 1], axis=1)


def main():
    n_features = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    n_samples = 2 * n_features
    n_targets = 16
    poly_degree = 5
    noise_std = 0.1

    rng = np.random.default_rng(12345)

    # Design matrix: Legendre basis in a scalar input + Gaussian random features.
    t = rng.uniform(-1.0, 1.0, size=n_samples)
    poly = legendre_columns(t, poly_degree)
    n_random = n_features - poly.shape[1]
    feats = rng.standard_normal((n_samples, n_random))
    X = np.concatenate([poly, feats], axis=1)

    beta_true = rng.standard_normal((n_features, n_targets))
    beta_true[: poly.shape[1], 0] = [1.5, -2.0, 0.75, 0.5, -0.25, 0.125]
    Y = np.matmul(X, beta_true) + noise_std * rng.standard_normal((n_samples, n_targets))

    # --- Normal equations with Cholesky -------------------------------------
    G = np.matmul(X.T, X)                      # Gram matrix (n_features^2)
    XtY = np.dot(X.T, Y)
    L = np.linalg.cholesky(G)
    Z = np.linalg.solve(L, XtY)                # forward solve  L z = X^T y
    beta_chol = np.linalg.solve(L.T, Z)        # backward solve L^T b = z

    # --- Thin QR cross-check ------------------------------------------------
    Q, R = np.linalg.qr(X)                     # reduced mode
    QtY = np.matmul(Q.T, Y)
    beta_qr = np.linalg.solve(R, QtY)

    # --- Diagnostics --------------------------------------------------------
    resid = Y - np.matmul(X, beta_chol)
    rss_per_target = np.einsum("ij,ij->j", resid, resid)
    dof = n_samples - n_features
    resid_rms = np.sqrt(rss_per_target.sum() / (n_samples * n_targets))
    sigma_hat = np.sqrt(rss_per_target.sum() / (dof * n_targets))

    # Residual must be orthogonal to the column space (normal equations).
    ortho = np.max(np.abs(np.dot(X.T, resid))) / np.max(np.abs(XtY))

    coef_err = np.linalg.norm(beta_chol - beta_true) / np.linalg.norm(beta_true)
    max_diff = np.max(np.abs(beta_chol - beta_qr))

    # Condition number estimate of X from the R factor's singular values.
    s = np.linalg.svd(R, compute_uv=False)
    cond_X = s[0] / s[-1]

    print(f"problem: {n_samples} samples x {n_features} features, {n_targets} targets")
    print(f"cond(X): {cond_X:.4g}")
    print("polynomial coefficients (target 0):")
    for k in range(poly.shape[1]):
        print(f"  P{k}: {beta_chol[k, 0]: .5f}  (true {beta_true[k, 0]: .5f})")
    print(f"relative coefficient error: {coef_err:.6e}")
    print(f"residual RMS: {resid_rms:.6e}")
    print(f"noise std estimate: {sigma_hat:.6f}")
    print(f"residual orthogonality ok: {bool(ortho < 1e-9)}")
    print(f"cholesky vs qr agree (max diff < 1e-8): {bool(max_diff < 1e-8)}")


if __name__ == "__main__":
    main()
