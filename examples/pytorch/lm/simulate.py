#!/usr/bin/env python3
"""Trains the LM task (docs/lm-task.md) with P ranks simulated in one process, each rank's
gradient compressed by one of the study's methods (methods.py), and prints one JSON line of
results.

    OMP_NUM_THREADS=1 python3 -s simulate.py --method topk --density 0.01 --ef raw --seed 1

Each step, every rank computes the gradient of its own minibatch (data.train_batch), the method
turns the P gradients into one, and Adam (written out below, the same update as torch.optim.Adam
without weight decay) applies it. Validation loss is measured every --eval-every steps on the fixed
validation set.

Methods (--method):
  dense          the mean of the P gradients
  topk           per-rank top-k, --ef none|raw, --decay, --reset-every, --warmup-dense, --exp-warmup
  sign, uniform  gradcomp's sign and uniform quantizers (--bits), with --ef none|raw
  frozen-v       top-k + EF on the gradient as topk, but Adam's second moment is frozen after
                 --warmup-dense dense steps (isolates the second moment's part)
  onebit-topk    1-bit Adam's scheme with top-k in place of sign: dense Adam for --warmup-dense
                 steps, then v frozen; every rank forms its momentum from the shared momentum,
                 compresses it with error feedback; the mean is the new shared momentum
  --optimizer sgd  momentum SGD instead of Adam; with dgc-adam this is DGC itself (u_r ← μ·u_r +
                 g_r, acc_r ← acc_r + u_r, top-k of |acc_r|, masking, the mean applied by plain SGD)
  dgc-adam       DGC's momentum correction and factor masking in Adam's update space: dense for
                 --warmup-dense steps, then v frozen; u_r ← β1·u_r + (1−β1)·g_r, acc_r ← acc_r + u_r;
                 the k largest |acc_r|/(√v̂ + ε) are sent; u_r and acc_r are zeroed where sent
"""

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import load_corpus, train_batch, validation_batches  # noqa: E402
from methods import Method, Quantizer, TopK, topk  # noqa: E402
from model import ByteLM, validation_loss  # noqa: E402

BETA1, BETA2, EPS = 0.9, 0.999, 1e-8
SNR_WINDOW = 50  # steps over which the gradient's signal-to-noise ratio is measured


def flat_grad(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def add_to_params(model, delta):
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.add_(delta[offset : offset + p.numel()].view_as(p))
            offset += p.numel()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--method", default="dense", choices=["dense", "topk", "sign", "uniform", "frozen-v", "onebit-topk", "dgc-adam"])
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--ef", default="none", choices=["none", "raw"])
    ap.add_argument("--decay", type=float, default=1.0)
    ap.add_argument("--reset-every", type=int, default=0)
    ap.add_argument("--warmup-dense", type=int, default=0)
    ap.add_argument("--exp-warmup", type=int, default=0)
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--optimizer", default="adam", choices=["adam", "sgd"], help="sgd: momentum SGD (PyTorch's form, m ← μ·m + g)")
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--val-windows", type=int, default=256)
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    torch.set_num_threads(1)

    train, validation, digest = load_corpus()
    val = validation_batches(validation, args.context, args.val_windows, 64)
    torch.manual_seed(args.seed)
    model = ByteLM(context=args.context)
    n = sum(p.numel() for p in model.parameters())
    P = args.ranks

    if args.method == "dense":
        method = Method(n, P)
    elif args.method in ("topk", "frozen-v"):
        method = TopK(n, P, args.density, None if args.ef == "none" else args.ef, args.decay, args.reset_every, args.warmup_dense, args.exp_warmup)
    elif args.method in ("sign", "uniform"):
        method = Quantizer(n, P, args.method, args.bits, args.ef == "raw")
    else:
        method = None  # onebit-topk, dgc-adam: handled in the loop
    k = max(1, int(round(args.density * n)))

    m, v = torch.zeros(n), torch.zeros(n)
    local = [torch.zeros(n) for _ in range(P)]  # onebit-topk: EF residual; dgc-adam: momentum u_r
    acc = [torch.zeros(n) for _ in range(P)]  # dgc-adam: accumulated momentum
    frozen = args.method in ("frozen-v", "onebit-topk", "dgc-adam")
    history, sent_bytes = [], 0
    recent = torch.zeros(SNR_WINDOW, n)
    t0 = time.time()
    for step in range(args.steps):
        grads, losses = [], []
        for r in range(P):
            x, y = train_batch(train, args.seed, step, r, args.batch, args.context)
            loss = model.loss(x, y)
            model.zero_grad()
            loss.backward()
            grads.append(flat_grad(model))
            losses.append(float(loss))
        t = step + 1
        dense_phase = step < args.warmup_dense
        extra = {}
        if args.optimizer == "sgd" and (method is not None or dense_phase):
            g = method.aggregate(grads, step, None) if method is not None else torch.stack(grads).mean(dim=0)
            sent_bytes += method.bytes_per_rank(step) if method is not None else 4 * n
            m.mul_(args.momentum).add_(g)
            vhat = torch.ones(n)
            update = -args.lr * m
        elif method is not None:
            g = method.aggregate(grads, step, None)
            sent_bytes += method.bytes_per_rank(step)
            m.mul_(BETA1).add_(g, alpha=1 - BETA1)
            if not (frozen and not dense_phase):
                v.mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
            vhat = v / (1 - BETA2 ** min(t, args.warmup_dense if frozen and not dense_phase else t))
            update = -args.lr * (m / (1 - BETA1**t)) / (vhat.sqrt() + EPS)
        elif dense_phase:
            g = torch.stack(grads).mean(dim=0)
            sent_bytes += 4 * n
            m.mul_(BETA1).add_(g, alpha=1 - BETA1)
            v.mul_(BETA2).addcmul_(g, g, value=1 - BETA2)
            vhat = v / (1 - BETA2**t)
            update = -args.lr * (m / (1 - BETA1**t)) / (vhat.sqrt() + EPS)
            for r in range(P):  # 1-bit Adam starts its compressed stage with zero errors
                local[r].zero_()
                acc[r].zero_()
        else:
            sgd = args.optimizer == "sgd"
            vhat = torch.ones(n) if sgd else v / (1 - BETA2**args.warmup_dense)
            denom = torch.ones(n) if sgd else vhat.sqrt() + EPS
            sent_bytes += 8 * k
            out = torch.zeros(n)
            for r in range(P):
                if args.method == "onebit-topk":
                    a = BETA1 * m + (1 - BETA1) * grads[r] + local[r]
                    c, _ = topk(a, k)
                    local[r] = a - c
                    out += c
                else:  # dgc-adam
                    local[r].mul_(args.momentum if sgd else BETA1).add_(grads[r], alpha=1 if sgd else 1 - BETA1)
                    acc[r].add_(local[r])
                    _, idx = topk(acc[r] / denom, k)
                    out[idx] += acc[r][idx]
                    acc[r][idx] = 0
                    local[r][idx] = 0
            out /= P
            if args.method == "onebit-topk":
                m = out
                update = -args.lr * m / denom
            else:
                update = -args.lr * out / denom
            extra = {"residual_over_grad": float((local[0] if args.method == "onebit-topk" else acc[0]).norm() / grads[0].norm())}
        add_to_params(model, update)
        gmean = torch.stack(grads).mean(dim=0)
        recent[step % SNR_WINDOW] = gmean
        if t % args.eval_every == 0 or t == args.steps:
            # signal to noise of the true mean gradient over the last SNR_WINDOW steps, per coordinate
            window = recent[: min(t, SNR_WINDOW)]
            snr = window.mean(dim=0).abs() / (window.std(dim=0) + 1e-30)
            rec = {
                "step": t,
                "val_loss": validation_loss(model, val),
                "train_loss": sum(losses) / P,
                "update_rms_over_lr": float(update.norm() / math.sqrt(n) / args.lr),
                "moved_frac": float((update.abs() > 0.01 * args.lr).float().mean()),
                "vhat_zero_frac": float((vhat == 0).float().mean()),
                "sqrt_vhat_median_nonzero": float(vhat[vhat > 0].sqrt().median()) if bool((vhat > 0).any()) else 0.0,
                "moved_update_mean_over_lr": float(update.abs()[update.abs() > 0.01 * args.lr].mean() / args.lr) if bool((update.abs() > 0.01 * args.lr).any()) else 0.0,
                "true_grad_rms": float(gmean.norm() / math.sqrt(n)),
                "cos_update_truegrad": float(torch.nn.functional.cosine_similarity(-update, gmean, dim=0)),
                "snr_median": float(snr.median()),
                "snr_above_0.5": float((snr > 0.5).float().mean()),
                "snr_above_1": float((snr > 1).float().mean()),
            }
            rec.update(method.stats if method is not None else {})
            rec.update(extra)
            history.append(rec)
            print(json.dumps(rec), file=sys.stderr, flush=True)
    dense_ring = 2 * (P - 1) / P * 4 * n * args.steps
    result = {
        "label": args.label,
        "args": vars(args),
        "params": n,
        "corpus_sha256": digest,
        "final_val_loss": history[-1]["val_loss"],
        "bytes_per_rank_message": sent_bytes / args.steps,
        "saved_gather": dense_ring / ((P - 1) * sent_bytes),
        "saved_scatter_reduce": dense_ring / (2 * (P - 1) / P * sent_bytes),
        "seconds": time.time() - t0,
        "history": history,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
