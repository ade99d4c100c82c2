#!/usr/bin/env python3
"""What GraVAC's gain measures on the LM task (docs/control.md §1.1, the back-off's reason).

Trains the task densely as train_hook.py does at P = 4 (seed 1: the same model, minibatches per
(seed, step, rank) and Adam; the four ranks' gradients computed in this one process and averaged)
and, beside it, keeps for each top-k density θ and rank a shadow error-feedback residual e, updated
as GraVAC's both_paths feedback does (e <- g + e - C(g + e)) but never applied. At a few steps it
prints, for each θ, the ratios of magnitudes summed over the ranks, a magnitude being the sum of
the layers' L2 norms (GraVAC's `norm` measure; top-k over the whole model, one bucket as in the
hook):

    C(g)/g          sum ||C(g)|| / sum ||g||           the gain without the residual (gain_input = gradient)
    C(g+e)/g        sum ||C(g + e)|| / sum ||g||       the gain the reference measures (gain_input = compensated)
    C(g+e)/(g+e)    sum ||C(g + e)|| / sum ||g + e||   the fraction of the compensated gradient sent
    (g+e)/g         sum ||g + e|| / sum ||g||          how far the residual has grown

    OMP_NUM_THREADS=1 nice -n 10 /usr/bin/python3 -s gravac_gains.py > gravac_gains.txt

With --ladder it prints instead, for the uniform quantizer of each width b in 8, 4, 2, 1 bits with
a scale per 64 values (round to nearest even, docs/quantizers.md §2; here in torch, independent of
gradcomp's code), the gain of the ladder row (gain_input = gradient, measure kept_energy:
docs/control.md §1.8) and, for comparison, the `norm` measure's ratio:

    kept(Q_b(g))/g    sum over ranks and layers of max(0, ||g_l||^2 - ||g_l - Q_b(g)_l||^2) / sum ||g_l||^2
    Q_b(g)/g          sum ||Q_b(g)_l|| / sum ||g_l||  (what the norm measure would compare)

    OMP_NUM_THREADS=1 nice -n 10 /usr/bin/python3 -s gravac_gains.py --ladder > gravac_ladder_gains.txt

The residuals follow the dense trajectory, not a compressed one, so the figures show what each
gain measures, not a run's exact values. Top-k keeps round(θ·n) values (n = 137,216), ties by
torch.topk.
"""

import sys

import torch
import torch.nn.functional as F

from data import load_corpus, train_batch
from model import ByteLM, VOCAB

P, SEED, BATCH, CONTEXT = 4, 1, 4, 64
DENSITIES = [0.1, 0.05, 0.025, 0.0125, 0.00625, 0.003125, 0.0015625]
PRINTED = [0, 1, 2, 25, 50, 75]


def magnitude(x, sizes):
    return sum(float(c.norm()) for c in torch.split(x, sizes))


def topk(x, density):
    k = max(1, round(density * x.numel()))
    out = torch.zeros_like(x)
    kept = x.abs().topk(k).indices
    out[kept] = x[kept]
    return out


WIDTHS, BLOCK = [8, 4, 2, 1], 64


def uniform(x, bits):
    """Q_b(x): per block of BLOCK values, m = max |x|, levels q·m/L (L = 2^(b-1) - 1, q in [-L, L],
    round to nearest even) for b >= 2, and ±m (0 to +m) for b = 1."""
    padded = torch.zeros((x.numel() + BLOCK - 1) // BLOCK * BLOCK)
    padded[:x.numel()] = x
    blocks = padded.view(-1, BLOCK)
    m = blocks.abs().amax(1, keepdim=True)
    if bits == 1:
        out = torch.where(blocks < 0, -m, m)
    else:
        levels = 2 ** (bits - 1) - 1
        s = m / levels
        q = torch.where(s > 0, torch.round(blocks / torch.where(s > 0, s, 1.0)), 0.0).clamp(-levels, levels)
        out = q * s
    return out.reshape(-1)[:x.numel()]


def kept_energy(g, q, sizes):
    return sum(max(0.0, float(a.square().sum()) - float((a - b).square().sum()))
               for a, b in zip(torch.split(g, sizes), torch.split(q, sizes)))


def ladder_rows(grads, sizes):
    energy = sum(float(g.square().sum()) for g in grads)
    norms = sum(magnitude(g, sizes) for g in grads)
    rows = []
    for bits in WIDTHS:
        quantized = [uniform(g, bits) for g in grads]
        kept = sum(kept_energy(g, q, sizes) for g, q in zip(grads, quantized))
        norm = sum(magnitude(q, sizes) for q in quantized)
        rows.append(f"  {bits} bits   kept(Q_b(g))/g {kept / energy:.3f}   Q_b(g)/g {norm / norms:.3f}")
    return rows


def main():
    ladder = "--ladder" in sys.argv[1:]
    torch.set_num_threads(1)
    train, _, _ = load_corpus()
    torch.manual_seed(SEED)
    model = ByteLM(context=CONTEXT)
    params = list(model.parameters())
    sizes = [p.numel() for p in params]
    optimizer = torch.optim.Adam(params, lr=2e-3, betas=(0.9, 0.999), eps=1e-8)
    residuals = {d: [torch.zeros(sum(sizes)) for _ in range(P)] for d in DENSITIES}
    for step in range(PRINTED[-1] + 1):
        grads = []
        for rank in range(P):
            x, y = train_batch(train, SEED, step, rank, BATCH, CONTEXT)
            model.zero_grad()
            F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)).backward()
            grads.append(torch.cat([p.grad.reshape(-1) for p in params]))
        g_total = sum(magnitude(g, sizes) for g in grads)
        rows = ladder_rows(grads, sizes) if ladder and step in PRINTED else []
        for d in [] if ladder else DENSITIES:
            raw = sent = compensated_total = 0.0
            for rank, g in enumerate(grads):
                raw += magnitude(topk(g, d), sizes)
                compensated = g + residuals[d][rank]
                c = topk(compensated, d)
                sent += magnitude(c, sizes)
                compensated_total += magnitude(compensated, sizes)
                residuals[d][rank] = compensated - c
            rows.append(f"  θ = {d * 100:8.5f}%   C(g)/g {raw / g_total:.3f}   C(g+e)/g {sent / g_total:.3f}   "
                        f"C(g+e)/(g+e) {sent / compensated_total:.3f}   (g+e)/g {compensated_total / g_total:.2f}")
        if step in PRINTED:
            print(f"step {step}", *rows, sep="\n", flush=True)
        mean = torch.stack(grads).mean(0)
        for p, m in zip(params, torch.split(mean, sizes)):
            p.grad = m.view_as(p).clone()
        optimizer.step()


if __name__ == "__main__":
    main()
