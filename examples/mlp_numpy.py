"""A small multilayer perceptron trained in plain NumPy: every product is `@`, `@=` or `.dot`.

Synthetic classification: n_samples points in 64 dimensions from 10 Gaussian clusters, mixed in
place by a fixed random linear map (`X @= M`). A 64-256-128-10 network with tanh hidden layers and a
softmax output is trained by full-batch gradient descent with momentum on the cross-entropy loss.
Forward and backward passes are written the way such code usually is: `X @ W`, `H.dot(W)`,
`H.T @ G`, `G.dot(W.T)`; no call to a NumPy product function appears.

Deterministic (fixed seeds, no threads of its own): the printed losses are the same under plain
python and through the shim.

Usage: python examples/mlp_numpy.py [n_samples]   (default 4096)
"""

import sys

import numpy as np

D_IN, HIDDEN1, HIDDEN2, CLASSES = 64, 256, 128, 10
EPOCHS, LEARNING_RATE, MOMENTUM = 120, 0.2, 0.9


def make_data(rng, n_samples):
    centres = rng.standard_normal((CLASSES, D_IN)) * 0.35
    labels = np.arange(n_samples) % CLASSES
    X = centres[labels] + rng.standard_normal((n_samples, D_IN))
    M = np.eye(D_IN) + 0.1 * rng.standard_normal((D_IN, D_IN))
    X @= M                                       # features mixed in place
    X -= X.mean(axis=0)
    X /= X.std(axis=0)
    return X, labels


def init_layer(rng, fan_in, fan_out):
    return rng.standard_normal((fan_in, fan_out)) * np.sqrt(1.0 / fan_in), np.zeros(fan_out)


def forward(params, X):
    (W1, b1), (W2, b2), (W3, b3) = params
    H1 = np.tanh(X @ W1 + b1)
    H2 = np.tanh(H1.dot(W2) + b2)
    logits = H2 @ W3 + b3
    logits -= logits.max(axis=1, keepdims=True)
    P = np.exp(logits)
    P /= P.sum(axis=1, keepdims=True)
    return H1, H2, P


def loss_and_grads(params, X, Y):
    (W1, _), (W2, _), (W3, _) = params
    H1, H2, P = forward(params, X)
    n = X.shape[0]
    loss = -np.sum(Y * np.log(P + 1e-300)) / n
    G3 = (P - Y) / n                             # d loss / d logits
    dW3, db3 = H2.T @ G3, G3.sum(axis=0)
    G2 = G3.dot(W3.T) * (1.0 - H2 * H2)
    dW2, db2 = H1.T.dot(G2), G2.sum(axis=0)
    G1 = (G2 @ W2.T) * (1.0 - H1 * H1)
    dW1, db1 = X.T @ G1, G1.sum(axis=0)
    return loss, [(dW1, db1), (dW2, db2), (dW3, db3)]


def main():
    n_samples = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    rng = np.random.default_rng(2024)
    X, labels = make_data(rng, n_samples)
    Y = np.eye(CLASSES)[labels]
    params = [init_layer(rng, D_IN, HIDDEN1), init_layer(rng, HIDDEN1, HIDDEN2), init_layer(rng, HIDDEN2, CLASSES)]
    velocity = [(np.zeros_like(W), np.zeros_like(b)) for W, b in params]

    for epoch in range(EPOCHS + 1):
        loss, grads = loss_and_grads(params, X, Y)
        if epoch % 40 == 0:
            print(f"epoch {epoch:4d}  loss {loss:.6f}")
        if epoch == EPOCHS:
            break
        for (W, b), (vW, vb), (dW, db) in zip(params, velocity, grads):
            vW *= MOMENTUM
            vW -= LEARNING_RATE * dW
            vb *= MOMENTUM
            vb -= LEARNING_RATE * db
            W += vW
            b += vb

    _, _, P = forward(params, X)
    accuracy = np.mean(P.argmax(axis=1) == labels)
    print(f"samples: {n_samples}, layers: {D_IN}-{HIDDEN1}-{HIDDEN2}-{CLASSES}, epochs: {EPOCHS}")
    print(f"final loss: {loss:.6g}")
    print(f"training accuracy: {accuracy:.4f}")


if __name__ == "__main__":
    main()
