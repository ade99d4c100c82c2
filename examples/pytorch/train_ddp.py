#!/usr/bin/env python3
"""Trains a small MLP with DistributedDataParallel over gloo (CPU), once with dense DDP and once
per gradcomp codec given, and prints loss and bytes per step.

    OMP_NUM_THREADS=1 python3 train_ddp.py --world 2 --codec dense --codec "top-k 1% + EF"

Every rank draws its own minibatches from a synthetic 10-class problem (Gaussian clusters in 64
dimensions, the same on every rank); the model is 64-128-10 (9,610 parameters), SGD at 0.1. After
every step the ranks compare a SHA-256 of their parameters and stop at the first difference.

Checks the tests run (exit status 1 when one fails):
  --max-loss-gap PCT     every codec ends within PCT % of the first (dense) row's final loss
  --resume-at K          each codec also runs K steps, checkpoints (model, optimizer, hook state)
                         to a file, and continues in fresh processes: the final parameters must
                         equal the uninterrupted run's
  --nan-at S             rank 1's step-S batch holds a NaN: every rank must skip step S
  --record DIR           every bucket's input, mean and state go to DIR/<row>/rank<r>.bin, the
                         codec's name to DIR/<row>/codec.txt (matches_mpi.sh replays them)
"""

import argparse
import faulthandler
import hashlib
import json
import math
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import gradcomp  # the package: python3 -m pip install --no-build-isolation ./python

FEATURES, HIDDEN, CLASSES = 64, 128, 10
BATCH = 32
LEARNING_RATE = 0.1
LOSS_WINDOW = 20  # the final loss is the mean over the last steps


def make_model(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, CLASSES))


def batch(seed, rank, step):
    """Rank `rank`'s minibatch of step `step`: a function of its arguments only, so a resumed run
    draws the same batches."""
    centers = torch.randn(CLASSES, FEATURES, generator=torch.Generator().manual_seed(seed)) * 0.5
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank * 10_007 + step + 1)
    labels = torch.randint(0, CLASSES, (BATCH,), generator=g)
    x = centers[labels] + torch.randn(BATCH, FEATURES, generator=g)
    return x, labels


def parameter_digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.digest()


def check_same_everywhere(digest, step):
    mine = torch.frombuffer(bytearray(digest), dtype=torch.int64)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    if any(not torch.equal(g, mine) for g in gathered):
        raise RuntimeError(f"the ranks' parameters differ after step {step}")


def worker(rank, args, codec, first_step, last_step, checkpoint_in, checkpoint_out, result_path, record):
    if args.watchdog > 0:  # a hung rank prints where every thread is and exits
        faulthandler.dump_traceback_later(args.watchdog, exit=True)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    try:
        model = make_model(args.seed)
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
        hook = None
        if codec != gradcomp.DENSE:
            hook = gradcomp.GradcompHookState(codec, model, dense_below=args.dense_below, record=record,
                                              dense_steps=args.dense_steps)
            ddp.register_comm_hook(hook, gradcomp.gradcomp_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        if checkpoint_in:
            saved = torch.load(checkpoint_in.format(rank=rank))
            model.load_state_dict(saved["model"])
            optimizer.load_state_dict(saved["optimizer"])
            if hook is not None:
                hook.load_state_dict(saved["hook"])
        n = sum(p.numel() for p in model.parameters())
        losses, sent, wire, dense, skipped = [], 0, 0, 0, []
        for step in range(first_step, last_step):
            x, y = batch(args.seed, rank, step)
            if step == args.nan_at and rank == 1 % args.world:
                x = x * float("nan")
            loss = F.cross_entropy(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            # The hook reports a non-finite bucket on every rank alike; dense DDP's gradients are
            # the same all-reduced values on every rank, so the ranks decide alike too.
            non_finite = hook.step_skipped if hook is not None else \
                not all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
            if non_finite:
                skipped.append(step)
            else:
                optimizer.step()
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            losses.append(mean_loss.item() / args.world)
            world = args.world
            dense_step = 2 * (world - 1) * n * 4 // world
            sent += hook.sent_bytes if hook is not None else dense_step
            wire += hook.wire_bytes if hook is not None else dense_step
            dense += dense_step
            check_same_everywhere(parameter_digest(model), step)
            if args.log_every and step % args.log_every == 0 and rank == 0:
                print(f"  [{codec}] step {step:4} loss {losses[-1]:.4f} bytes {hook.sent_bytes if hook else dense_step} "
                      f"plan {plans_of(hook)}", flush=True)
        if checkpoint_out:
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "hook": hook.state_dict() if hook is not None else None}, checkpoint_out.format(rank=rank))
        if rank == 0:
            steps = max(1, last_step - first_step)
            finite = [v for v in losses[-LOSS_WINDOW:] if math.isfinite(v)]
            with open(result_path, "w") as f:
                json.dump({"codec": codec, "loss": sum(finite) / max(1, len(finite)), "sent": sent / steps, "wire": wire / steps,
                           "dense": dense / steps, "digest": parameter_digest(model).hex(), "skipped": skipped,
                           "relaid": hook.relaid if hook is not None else 0, "plan": plans_of(hook)}, f)
    finally:
        dist.destroy_process_group()
    # Leave without running destructors: torch 1.13's gloo objects now and then hang while they
    # are torn down after a run (seen on 2 cores with 4 ranks), and everything is written.
    sys.stdout.flush()
    os._exit(0)


def plans_of(hook):
    """The plans the hook's buckets ran in the last step (DDP's own all-reduce without a hook)."""
    return "+".join(sorted(set(hook.plans.values()))) if hook is not None and hook.plans else "dense"


def run(args, codec, first_step, last_step, checkpoint_in=None, checkpoint_out=None, record=None):
    """Runs `args.world` processes; returns rank 0's result."""
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "result.json")
        mp.spawn(worker, nprocs=args.world, join=True,
                 args=(args, codec, first_step, last_step, checkpoint_in, checkpoint_out, result_path, record))
        args.port += 1  # a fresh rendezvous for the next run
        with open(result_path) as f:
            return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--codec", action="append",
                        help="'dense', a preset of gradcomp.codec_names() or a codec's spec, the text of a "
                             "gradcomp.Codec such as 'topk density=0.01 error_feedback=1' (repeatable)")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
    parser.add_argument("--dense-below", type=int, default=0, help="buckets of fewer elements go dense")
    parser.add_argument("--dense-steps", type=int, default=0, help="warm-up: the first steps go dense")
    parser.add_argument("--port", type=int, default=29500)
    parser.add_argument("--log-every", type=int, default=0)
    parser.add_argument("--max-loss-gap", type=float, default=0.0)
    parser.add_argument("--resume-at", type=int, default=0)
    parser.add_argument("--nan-at", type=int, default=-1)
    parser.add_argument("--record", default="")
    parser.add_argument("--watchdog", type=float, default=0, help="seconds after which a rank dumps its stacks and exits")
    parser.add_argument("--list", action="store_true", help="print the codec names and exit")
    args = parser.parse_args()
    if args.list:
        print("\n".join(gradcomp.codec_names()))
        return 0
    codecs = args.codec or [gradcomp.DENSE, "top-k 1% + EF", "uniform 4-bit + LoCo"]
    failures = []
    results = []
    started = time.monotonic()
    for row, codec in enumerate(codecs):
        record = None
        if args.record:  # one directory per codec, its name in codec.txt
            record = os.path.join(args.record, str(row))
            os.makedirs(record, exist_ok=True)
            with open(os.path.join(record, "codec.txt"), "w") as f:
                f.write(codec)
        r = run(args, codec, 0, args.steps, record=record)
        results.append(r)
        if args.nan_at >= 0 and r["skipped"] != [args.nan_at]:
            failures.append(f"[{codec}] skipped steps {r['skipped']}, expected [{args.nan_at}]")
        if args.resume_at > 0 and codec != gradcomp.DENSE:
            with tempfile.TemporaryDirectory() as tmp:
                checkpoint = os.path.join(tmp, "rank{rank}.pt")
                run(args, codec, 0, args.resume_at, checkpoint_out=checkpoint)
                resumed = run(args, codec, args.resume_at, args.steps, checkpoint_in=checkpoint)
            same = resumed["digest"] == r["digest"]
            print(f"[{codec}] checkpoint at step {args.resume_at} and resumed in fresh processes: "
                  f"{'bit-identical' if same else 'DIFFERENT'} final parameters")
            if not same:
                failures.append(f"[{codec}] the resumed run ends with other parameters")
    base = results[0]
    width = max(len(r["codec"]) for r in results)
    print(f"\n{args.world} ranks, {args.steps} steps, gloo\n")
    plan_width = max(len(r["plan"]) for r in results)
    print(f"{'codec':<{width}}  {'plan':<{plan_width}}  {'bytes/step':>10} {'ratio':>7} {'wire/step':>10} {'final loss':>10} "
          f"{'vs ' + base['codec']:>9}  {'re-laid':>7}  parameters")
    for r in results:
        gap = 100.0 * (r["loss"] - base["loss"]) / base["loss"]
        print(f"{r['codec']:<{width}}  {r['plan']:<{plan_width}}  {r['sent']:>10.0f} {r['dense'] / r['sent']:>6.2f}x "
              f"{r['wire']:>10.0f} {r['loss']:>10.4f} "
              f"{gap:>+8.1f}%  {r['relaid']:>7}  {r['digest'][:16]}")
        if args.max_loss_gap > 0 and r is not base and not gap <= args.max_loss_gap:
            failures.append(f"[{r['codec']}] ends {gap:+.1f}% from [{base['codec']}], over {args.max_loss_gap}%")
    print(f"\nplan: the buckets' plans in the last step (the library's automatic_plan; scatter_reduce sends about "
          f"2(P - 1)/P of one message whatever P, gather_decode P - 1 messages); bytes/step: what each rank sends per "
          f"step (report.sent_bytes: an all-gathered message counts P - 1 times); ratio: a ring all-reduce of the dense "
          f"gradient over that; wire/step: every byte the process group moved per rank (hook.wire_bytes: agreement, "
          f"sizes, padding). {time.monotonic() - started:.1f} s")
    for f in failures:
        print("FAILED:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
