#!/usr/bin/env python3
"""One Adam coordinate fed as error feedback feeds it through a sparsifier (docs/feedback.md §10.3).

The coordinate's gradient is g_t = μ + σ·z_t (z standard normal). Dense training gives Adam g_t
every step. Under top-k + error feedback the coordinate is sent every τ steps, and what is sent is
the residual: the sum of the gradients since the last send (the other steps Adam sees 0). The
script prints the distance the coordinate moves in the direction of μ per step, in units of lr,
for Adam as it is and for Adam with its second moment frozen at the dense value.
"""

import torch

BETA1, BETA2, EPS = 0.9, 0.999, 1e-8


def drift(mu, sigma, tau, frozen_v=None, steps=20000, seed=0):
    g = mu + sigma * torch.randn(steps, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    m = v = 0.0
    x = 0.0
    acc = 0.0
    for t in range(1, steps + 1):
        acc += float(g[t - 1])
        if t % tau == 0:
            sent, acc = acc, 0.0
        else:
            sent = 0.0
        m = BETA1 * m + (1 - BETA1) * sent
        v = BETA2 * v + (1 - BETA2) * sent * sent
        vh = frozen_v if frozen_v is not None else v / (1 - BETA2**t)
        x -= (m / (1 - BETA1**t)) / (vh**0.5 + EPS)
    return -x / steps * (1 if mu >= 0 else -1)


def main():
    print("movement along the mean gradient per step, in units of lr (dense Adam = tau 1)")
    print(f"{'mu':>5} {'sigma':>5} | " + " ".join(f"tau={t:<4d}" for t in (1, 3, 10, 30, 100)) + " | frozen v, tau=100")
    for mu, sigma in ((1.0, 0.0), (1.0, 1.0), (1.0, 3.0), (1.0, 10.0), (1.0, 30.0)):
        row = [drift(mu, sigma, tau) for tau in (1, 3, 10, 30, 100)]
        frozen = drift(mu, sigma, 100, frozen_v=mu * mu + sigma * sigma)
        print(f"{mu:5.1f} {sigma:5.1f} | " + " ".join(f"{r:8.3f}" for r in row) + f" | {frozen:8.3f}")


if __name__ == "__main__":
    main()
