"""Exact torch versions of the compression methods the study compares (docs/feedback.md §10).

A study tool, not the library: each rank's flattened gradient is compressed on its own and the
decoded messages are averaged, as gradcomp's `gather_decode` aggregation does. Every method keeps
one state per simulated rank.
"""

import math

import torch


def topk(a, k):
    """a with all but its k largest-magnitude elements zeroed; the kept indices."""
    idx = torch.topk(a.abs(), k, sorted=False).indices
    out = torch.zeros_like(a)
    out[idx] = a[idx]
    return out, idx


def sign_blocks(a, block=256):
    """gradcomp's sign quantizer: sign(x) times the block's mean magnitude (blocks of 256)."""
    n = a.numel()
    pad = (-n) % block
    x = torch.nn.functional.pad(a, (0, pad)).view(-1, block)
    counts = torch.full((x.shape[0], 1), float(block))
    counts[-1] = block - pad
    scale = x.abs().sum(dim=1, keepdim=True) / counts
    return (torch.where(x >= 0, 1.0, -1.0) * scale).view(-1)[:n]


def uniform_blocks(a, bits=4, block=256):
    """gradcomp's uniform quantizer, round to nearest even: s = max|x| / L per block, L = 2^(b−1) − 1."""
    n = a.numel()
    levels = 2 ** (bits - 1) - 1
    x = torch.nn.functional.pad(a, (0, (-n) % block)).view(-1, block)
    s = x.abs().amax(dim=1, keepdim=True) / levels
    q = torch.round(x / torch.where(s > 0, s, 1.0))
    return (q * s).view(-1)[:n]


class Method:
    """Dense averaging. Subclasses compress; `aggregate` gets the P gradients of one step and
    returns what the optimizer applies."""

    name = "dense"

    def __init__(self, n, ranks):
        self.n, self.ranks = n, ranks
        self.stats = {}

    def aggregate(self, grads, step, optimizer):
        return torch.stack(grads).mean(dim=0)

    def bytes_per_rank(self, step):
        """The bytes one rank's message holds at `step` (values and indices, no headers)."""
        return 4 * self.n


def density_at(step, density, warmup_dense=0, exp_warmup=0):
    """The density of step `step`: 1 for the first `warmup_dense` steps; then, over `exp_warmup`
    steps in four equal stages, DGC's exponential schedule 25%, 6.25%, 1.5625%, 0.390625% floored
    at the target; then the target."""
    if step < warmup_dense:
        return 1.0
    s = step - warmup_dense
    if s < exp_warmup:
        stage = 4 * s // exp_warmup
        return max(density, 0.25 ** (stage + 1))
    return density


class TopK(Method):
    """Top-k per rank, with or without error feedback.

    ef = None:    send C(g)
    ef = "raw":   a = g + e; send C(a); e ← decay·(a − C(a))   (gradcomp's error_feedback, decay 1)
    reset_every:  e ← 0 every that many steps
    """

    def __init__(self, n, ranks, density, ef=None, decay=1.0, reset_every=0, warmup_dense=0, exp_warmup=0):
        super().__init__(n, ranks)
        self.density, self.ef, self.decay, self.reset_every = density, ef, decay, reset_every
        self.warmup_dense, self.exp_warmup = warmup_dense, exp_warmup
        self.residual = [torch.zeros(n) for _ in range(ranks)]
        self.last_sent = torch.full((n,), -1, dtype=torch.long)  # the last step rank 0 sent each index
        self.ever_sent = torch.zeros(n, dtype=torch.bool)  # by any rank
        self.age_sum = 0.0
        self.age_count = 0

    def k_at(self, step):
        return max(1, int(round(density_at(step, self.density, self.warmup_dense, self.exp_warmup) * self.n)))

    def aggregate(self, grads, step, optimizer):
        k = self.k_at(step)
        if self.reset_every and step % self.reset_every == 0:
            for e in self.residual:
                e.zero_()
        out = torch.zeros(self.n)
        rnorm = gnorm = 0.0
        for r, g in enumerate(grads):
            a = g + self.residual[r] if self.ef else g
            if k >= self.n:
                c, idx = a.clone(), None
            else:
                c, idx = topk(a, k)
            if self.ef:
                self.residual[r] = self.decay * (a - c)
            out += c
            if idx is not None:
                self.ever_sent[idx] = True
                if r == 0:
                    prev = self.last_sent[idx]
                    seen = prev >= 0
                    self.age_sum += float((step - prev[seen]).sum())
                    self.age_count += int(seen.sum())
                    self.last_sent[idx] = step
            if r == 0:
                rnorm, gnorm = float(self.residual[0].norm()), float(g.norm())
        self.stats = {
            "residual_over_grad": rnorm / max(gnorm, 1e-30),
            "ever_sent": float(self.ever_sent.float().mean()),
            "mean_age_at_send": self.age_sum / max(self.age_count, 1),
        }
        return out / len(grads)

    def bytes_per_rank(self, step):
        k = self.k_at(step)
        return 4 * self.n if k >= self.n else 8 * k


class Quantizer(Method):
    """Sign (1 bit + a float per 256) or uniform b-bit (b bits + a float per 256), with or without
    error feedback on the raw gradient."""

    def __init__(self, n, ranks, kind, bits=4, ef=False):
        super().__init__(n, ranks)
        self.kind, self.bits, self.ef = kind, bits, ef
        self.residual = [torch.zeros(n) for _ in range(ranks)]

    def aggregate(self, grads, step, optimizer):
        out = torch.zeros(self.n)
        for r, g in enumerate(grads):
            a = g + self.residual[r] if self.ef else g
            c = sign_blocks(a) if self.kind == "sign" else uniform_blocks(a, self.bits)
            if self.ef:
                self.residual[r] = a - c
            out += c
        self.stats = {"residual_over_grad": float(self.residual[0].norm() / grads[0].norm())}
        return out / len(grads)

    def bytes_per_rank(self, step):
        bits = 1 if self.kind == "sign" else self.bits
        return math.ceil(self.n * bits / 8) + 4 * math.ceil(self.n / 256)
