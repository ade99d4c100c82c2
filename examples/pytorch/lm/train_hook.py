#!/usr/bin/env python3
"""Trains the LM task (docs/lm-task.md on the ef-study branch; docs/lm-hook-runs.md) as P real
processes: DistributedDataParallel over Gloo on localhost, each bucket reduced by gradcomp's PyTorch
hook (the gradcomp package, python/gradcomp/ddp.py), and prints one JSON line of results.

    OMP_NUM_THREADS=1 nice -n 10 python3 train_hook.py --world 4 --codec "uniform 4-bit + LoCo" --seed 1

(python3: one with torch and the package installed, `python3 -m pip install --no-build-isolation
./python` from the repository's root; docs/pytorch.md §1.)

The task is the simulation harness's (simulate.py): the same model and initialisation (ByteLM after
torch.manual_seed(seed)), the same minibatch per (seed, step, rank) (data.train_batch), Adam at
lr 2e-3, betas (0.9, 0.999), eps 1e-8 (torch.optim.Adam), the same fixed validation set evaluated
every --eval-every steps (rank 0, after the step). `--codec dense` is DDP's own all-reduce (no hook);
any other name is a row of the extension's codec_names(), tagc_names(), gravac_names(),
gravac_ladder_names() or powersgd_names() (`--list` prints them). Every rank runs torch.set_num_threads(1).

The JSON line: the arguments, the corpus digest, the final and per-evaluation validation loss (and
the ranks' mean training loss at that step), bytes this rank sent per step (the hook's sent_bytes;
for dense the ring all-reduce's 2(P - 1)/P * 4n) and what the process group moved per rank (the
hook's wire_bytes: agreement, sizes, padding too; `saved_on_the_wire`), the dense ring all-reduce's bytes and their ratio
(traffic saved), also over the compressed steps only (after --dense-steps), the plans the buckets
ran (the set over all steps), for TAGC rank 0's bytes by part (Tagc.bytes_by_part: index, sketch, tail,
padding, resent, dense, gather), the steps skipped for non-finite gradients, whether the ranks' final
parameters are identical, and the wall time; for GraVAC, `gravac_trace`: every change of what the
controller sends, as [first step, path, density or bit width (null: dense), gain of the
candidate, of the safe level] (`--print-decisions` also prints them as they happen).
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
import gradcomp  # noqa: E402
from data import load_corpus, train_batch, validation_batches  # noqa: E402
from model import VOCAB, ByteLM, validation_loss  # noqa: E402

BETAS, EPS = (0.9, 0.999), 1e-8


def parameters_identical_everywhere(model):
    digest = hashlib.sha256(b"".join(p.detach().contiguous().numpy().tobytes() for p in model.parameters())).digest()
    mine = torch.frombuffer(bytearray(digest), dtype=torch.int64)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    return all(torch.equal(g, mine) for g in gathered)


def worker(rank, args, result_path):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    started = time.monotonic()
    train, validation, digest = load_corpus()
    val = validation_batches(validation, args.context, args.val_windows, 64) if rank == 0 else None
    torch.manual_seed(args.seed)
    model = ByteLM(context=args.context)
    n = sum(p.numel() for p in model.parameters())
    # The causal mask is a bool buffer, which Gloo cannot broadcast; it is the same on every rank.
    torch.nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, ["mask"])
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb)
    hook = None
    if args.codec != gradcomp.DENSE:
        hook = gradcomp.GradcompHookState(args.codec, model, dense_below=args.dense_below,
                                          dense_steps=args.dense_steps, log=print if rank == 0 else (lambda *_: None),
                                          print_decisions=args.print_decisions)
        ddp.register_comm_hook(hook, gradcomp.gradcomp_hook)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, betas=BETAS, eps=EPS)
    P = args.world
    dense_ring = 2 * (P - 1) / P * 4 * n
    sent, sent_compressed, wire, plans, skipped, history = 0, 0, 0, set(), [], []
    for step in range(args.steps):
        x, y = train_batch(train, args.seed, step, rank, args.batch, args.context)
        loss = F.cross_entropy(ddp(x).reshape(-1, VOCAB), y.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        if hook is not None and hook.step_skipped:
            skipped.append(step)
        else:
            optimizer.step()
        step_bytes = hook.sent_bytes if hook is not None else dense_ring
        sent += step_bytes
        wire += hook.wire_bytes if hook is not None else dense_ring
        if step >= args.dense_steps:
            sent_compressed += step_bytes
        plans.update(hook.plans.values() if hook is not None else ["ddp all-reduce"])
        t = step + 1
        if t % args.eval_every == 0 or t == args.steps:
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            record = {"step": t, "val_loss": validation_loss(model, val) if rank == 0 else None,
                      "train_loss": mean_loss.item() / P, "bytes_this_step": step_bytes,
                      "seconds": time.monotonic() - started}
            if hook is not None and hook.gravac is not None:  # the density GraVAC chose for the coming step
                record["gravac_density"] = hook.gravac.density
            if hook is not None and hook.ladder is not None:  # the width GraVAC chose for the coming step
                d = hook.ladder.decision
                record["gravac_bits"] = {"candidate": d["candidate_bits"], "safe": d["safe_bits"]}.get(d["send"])
            history.append(record)
            if rank == 0 and args.progress:
                print(json.dumps(record), file=sys.stderr, flush=True)
    identical = parameters_identical_everywhere(model)
    if rank == 0:
        compressed_steps = args.steps - min(args.dense_steps, args.steps)
        result = {
            "label": args.label, "args": vars(args), "params": n, "corpus_sha256": digest,
            "final_val_loss": history[-1]["val_loss"],
            "bytes_per_rank_step": sent / args.steps,
            "dense_ring_bytes": dense_ring,
            "saved": dense_ring * args.steps / sent,
            "wire_bytes_per_rank_step": wire / args.steps,
            "saved_on_the_wire": dense_ring * args.steps / wire,
            "bytes_per_rank_compressed_step": sent_compressed / compressed_steps if compressed_steps else None,
            "saved_compressed_steps": dense_ring * compressed_steps / sent_compressed if sent_compressed else None,
            "plans": sorted(plans), "skipped_steps": skipped,
            "relaid": hook.relaid if hook is not None else 0,
            "tagc_bytes_by_part": hook.tagc.bytes_by_part() if hook is not None and hook.tagc is not None else None,
            "parameters_identical_on_all_ranks": identical,
            "seconds": time.monotonic() - started, "history": history,
        }
        if hook is not None and (hook.gravac is not None or hook.ladder is not None):  # every change of what GraVAC sent
            result["gravac_trace"] = hook.gravac_trace
        with open(result_path, "w") as f:
            json.dump(result, f)
    dist.destroy_process_group()
    # As train_ddp.py: leave without destructors (torch 1.13's gloo teardown now and then hangs).
    sys.stdout.flush()
    os._exit(0)


def summarize(paths):
    """The Markdown table of the runs in the JSON-lines files `paths`: per (P, codec, steps, dense
    steps, bucket cap, label), the seeds' final validation losses and their gaps to dense of the same P, seed,
    steps and batch per rank (mean, sample standard deviation, min..max), the traffic saved, the plans and the
    time."""
    runs = [json.loads(line) for path in paths for line in open(path) if line.strip()]
    dense = {(r["args"]["world"], r["args"]["seed"], r["args"]["steps"], r["args"]["batch"]): r["final_val_loss"]
             for r in runs if r["args"]["codec"] == gradcomp.DENSE}
    rows = {}
    for r in runs:
        a = r["args"]
        rows.setdefault((a["world"], a["steps"], a["codec"], a["dense_steps"], a["bucket_cap_mb"], r.get("label", "")),
                        []).append(r)
    print("| P | steps | row | seeds | final val loss | gap to dense, per seed | gap mean ± sd (min..max) "
          "| bytes/rank/step | saved vs ring | plans | s per run |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (world, steps, codec, dense_steps, cap, label), rs in sorted(
            rows.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] != "dense", kv[0][2], kv[0][5])):
        rs = sorted(rs, key=lambda r: r["args"]["seed"])
        gaps = [100 * (r["final_val_loss"] / dense[key] - 1) for r in rs
                if (key := (world, r["args"]["seed"], steps, r["args"]["batch"])) in dense]
        spread = ""
        if gaps:
            sd = (sum((g - sum(gaps) / len(gaps)) ** 2 for g in gaps) / (len(gaps) - 1)) ** 0.5 if len(gaps) > 1 else None
            spread = f"{sum(gaps) / len(gaps):+.2f}%" + (f" ± {sd:.2f} ({min(gaps):+.2f}..{max(gaps):+.2f})" if sd is not None else "")
        name = codec + (f", {dense_steps} dense steps" if dense_steps else "") + (f", {cap:g} MB buckets" if cap != 25.0 else "")
        name += f" [{label}]" if label else ""
        losses = ", ".join(f"{r['final_val_loss']:.4f}" for r in rs)
        per_seed = ", ".join(f"{g:+.2f}%" for g in gaps)
        seconds = ", ".join(f"{r['wall_seconds']:.0f}" for r in rs)
        plans = "+".join(sorted({p for r in rs for p in r["plans"]}))
        sent = sum(r["bytes_per_rank_step"] for r in rs) / len(rs)
        saved = sum(r["saved"] for r in rs) / len(rs)
        seeds = ", ".join(str(r["args"]["seed"]) for r in rs)
        print(f"| {world} | {steps} | {name} | {seeds} | {losses} | {per_seed} | {spread} | {sent:,.0f} | {saved:.2f}x "
              f"| {plans} | {seconds} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=4, help="P, the number of processes")
    ap.add_argument("--codec", default=gradcomp.DENSE, help="'dense' (DDP's all-reduce), a row name (--list) or a codec's spec "
                    "(the text of a gradcomp.Codec, e.g. 'uniform bits=2 block=64 loco=1 loco_beta=0.95')")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--dense-steps", type=int, default=0, help="warm-up: the hook's first steps go dense")
    ap.add_argument("--dense-below", type=int, default=0, help="buckets of fewer elements go dense")
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0, help="DDP's bucket size (25: one bucket)")
    ap.add_argument("--batch", type=int, default=4, help="windows per rank per step")
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--val-windows", type=int, default=256)
    ap.add_argument("--port", type=int, default=29700)
    ap.add_argument("--label", default="")
    ap.add_argument("--out", default="", help="also append the JSON line to this file")
    ap.add_argument("--progress", action="store_true", help="rank 0 prints each evaluation to stderr")
    ap.add_argument("--print-decisions", action="store_true",
                    help="GraVAC: rank 0 prints each change of what the controller sends")
    ap.add_argument("--list", action="store_true", help="print the row names and exit")
    ap.add_argument("--summarize", nargs="+", metavar="JSONL", help="print the table of these results and exit")
    args = ap.parse_args()
    if args.summarize:
        summarize(args.summarize)
        return 0
    if args.list:
        print("\n".join(gradcomp.codec_names()))
        return 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "result.json")
        mp.spawn(worker, nprocs=args.world, join=True, args=(args, result_path))
        with open(result_path) as f:
            result = json.load(f)
    result["wall_seconds"] = time.monotonic() - started
    line = json.dumps(result)
    print(line, flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
