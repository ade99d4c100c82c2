"""gradcomp codecs as a DistributedDataParallel communication hook.

    import gradcomp
    state = gradcomp.GradcompHookState("top-k 1% + EF", model)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(state, gradcomp.gradcomp_hook)
    ...
    loss.backward()
    if state.step_skipped:        # a gradient held NaN/Inf on some rank: every rank skips
        optimizer.zero_grad()
    else:
        optimizer.step()

Each bucket goes through gradcomp::compressed_all_reduce (C++, the extension gradcomp._gradcomp_torch
built from python/csrc/ when the package was installed), whose
collectives run on the process group through `ProcessGroupOps`: the ranks first all-gather a
40-byte agreement record (codec, parameters, size, step, bucket, a non-finite flag), then run the
plan the library's `automatic_plan` picks for the bucket (`hook.plans`): `scatter_reduce` (an
all-to-all of chunk messages, each owner sums and re-encodes its chunk with a server state, an
all-gather: about 2(P - 1)/P of one message per rank, whatever P) where it sends less than
`gather_decode` (all-gather the messages, decode them in rank order), or `summed_encodings`. The
bucket becomes the mean, the same bits on every rank and the same bits as gradcomp's own
collectives give for the same inputs. `sent_bytes` is what this rank's messages took in the step
(the library's report: frames, counted once per receiver); `wire_bytes` is every byte the process
group moved for it, per rank (ProcessGroupOps: agreement, sizes, padding, gloo's all-reduce for a
reduce-scatter, the ring algorithms' traffic).

Every bucket keeps a bucket state (its plan's chunk states, server state or one state; see
bucket_state.hpp), keyed by the names of the bucket's parameters; the hook compresses a bucket with
its parameters in the model's order, so a rebuild that only reorders a bucket leaves its state as
it was. When DDP rebuilds its buckets (after the first iteration) into other sets of parameters, a
bucket whose parameters changed takes the worker error of each of its parameters from the states
that held them (exact for error feedback; LoCo stores it again in 8 bits), the server error of its
rank's new chunk, and the step counters: nothing is reset. Server error of chunks the rank no
longer owns goes into a stateful codec's worker error, and is dropped and counted
(`server_values_dropped`) for a stateless codec. Every re-laying is counted (`relaid`) and logged. `state_dict()` / `load_state_dict()` put the states in a
checkpoint; a restored run continues bit for bit.
"""

import functools
import os
import time
import warnings

import torch
import torch.distributed as dist

from . import _gradcomp_torch
from .codecs import Codec

DENSE = "dense"


def extension():
    """The compiled extension (python/csrc/gradcomp_torch.cpp), built against this environment's torch
    when the package was installed."""
    return _gradcomp_torch


def _timed(collective):
    """A ProcessGroupOps collective whose wall-clock time is added to `wire_seconds`, unless
    another collective called it (then its caller's time holds it)."""
    @functools.wraps(collective)
    def timed(self, *args, **kwargs):
        self._depth += 1
        start = time.perf_counter()
        try:
            return collective(self, *args, **kwargs)
        finally:
            self._depth -= 1
            if self._depth == 0:
                self.wire_seconds += time.perf_counter() - start
    return timed


class ProcessGroupOps:
    """The collectives gradcomp's transport concept names, run on a torch.distributed group, in
    place. Buffers are CPU tensors; with NCCL each is staged through the current CUDA device.

    `wire_bytes` counts what every call moves, per rank: the collective's bytes over all the ranks
    divided by P, as the ring algorithms move them (all-reduce 2(P - 1)/P of the buffer,
    reduce-scatter (P - 1)/P of the input, all-gather P - 1 times the padded block) and a tree
    (reduce, broadcast: (P - 1)/P of the buffer); an all-to-all counts what this rank sends to the
    others. Everything counts: the sizes exchanged before a gather or an all-to-all, the padding to
    the longest rank's buffer, and gloo's reduce-scatter, which is an all-reduce (gloo has none).

    `wire_seconds` adds up the wall-clock time spent in these calls (including the staging copies
    of NCCL buffers and the waits for the other ranks); a call made by another (the sizes'
    all-reduce of a gather) is counted once, inside its caller."""

    def __init__(self, group=None):
        self.group = group if group is not None else dist.group.WORLD
        self.nccl = dist.get_backend(self.group) == "nccl"
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.nccl else torch.device("cpu")
        # Global rank of each group rank (dist.reduce and dist.broadcast name global ranks).
        if self.group is dist.group.WORLD:
            self._global = list(range(self.size()))
        else:
            self._global = dist.get_process_group_ranks(self.group)
        self.wire_bytes = 0
        self.wire_seconds = 0.0
        self._depth = 0  # calls in progress: only the outermost is timed

    def _count(self, total):
        """Adds a collective's bytes over all the ranks, divided by P (integer)."""
        self.wire_bytes += int(total) // self.size()

    def rank(self):
        return dist.get_rank(self.group)

    def size(self):
        return dist.get_world_size(self.group)

    def _staged(self, t, run):
        if not self.nccl:
            run(t)
            return
        on_device = t.to(self.device)
        run(on_device)
        t.copy_(on_device.cpu())

    def _all_reduce(self, t, op):
        self._count(2 * (self.size() - 1) * t.numel() * t.element_size())
        self._staged(t, lambda x: dist.all_reduce(x, op=op, group=self.group))

    @_timed
    def all_reduce_sum(self, t):
        self._all_reduce(t, dist.ReduceOp.SUM)

    @_timed
    def all_reduce_max(self, t):
        self._all_reduce(t, dist.ReduceOp.MAX)

    @_timed
    def all_reduce_or(self, t):
        if not self.nccl:
            self._all_reduce(t, dist.ReduceOp.BOR)
            return
        # NCCL has no bitwise OR: gather and OR here.
        parts = self.all_gather_bytes(t.clone())
        for part in parts:
            t.bitwise_or_(part)

    @_timed
    def reduce_sum(self, t, root):
        self._count((self.size() - 1) * t.numel() * t.element_size())
        self._staged(t, lambda x: dist.reduce(x, dst=self._global[root], op=dist.ReduceOp.SUM, group=self.group))

    @_timed
    def reduce_scatter_sum(self, inp, out):
        n = out.numel()
        if self.nccl:
            self._count((self.size() - 1) * inp.numel() * inp.element_size())
            blocks = list(inp.to(self.device).split(n))
            on_device = torch.empty_like(blocks[0])
            dist.reduce_scatter(on_device, blocks, op=dist.ReduceOp.SUM, group=self.group)
            out.copy_(on_device.cpu())
            return
        # Gloo has no reduce-scatter: all-reduce the P blocks and keep this rank's (counted as the
        # all-reduce it is).
        self.all_reduce_sum(inp)
        out.copy_(inp[self.rank() * n:(self.rank() + 1) * n])

    @_timed
    def broadcast(self, t, root):
        self._count((self.size() - 1) * t.numel() * t.element_size())
        self._staged(t, lambda x: dist.broadcast(x, src=self._global[root], group=self.group))

    @_timed
    def all_gather_bytes(self, t):
        """Every rank's uint8 buffer, in rank order (sizes may differ: padded to the longest)."""
        sizes = torch.zeros(self.size(), dtype=torch.int64)
        sizes[self.rank()] = t.numel()
        self.all_reduce_sum(sizes)
        longest = int(sizes.max())
        padded = torch.zeros(longest, dtype=torch.uint8, device=self.device)
        padded[:t.numel()] = t.to(self.device)
        gathered = [torch.empty(longest, dtype=torch.uint8, device=self.device) for _ in range(self.size())]
        self._count(self.size() * (self.size() - 1) * longest)
        dist.all_gather(gathered, padded, group=self.group)
        return [g[:int(n)].cpu() for g, n in zip(gathered, sizes)]

    @_timed
    def all_to_all_bytes(self, buffers):
        """buffers[j] (uint8) goes to rank j; returns the P buffers the ranks sent this one, in
        rank order: the sizes by one all_to_all_single, then the bytes by another with split sizes
        (Gloo has both)."""
        send_sizes = torch.tensor([b.numel() for b in buffers], dtype=torch.int64, device=self.device)
        recv_sizes = torch.empty(self.size(), dtype=torch.int64, device=self.device)
        self.wire_bytes += 8 * (self.size() - 1) + sum(b.numel() for j, b in enumerate(buffers) if j != self.rank())
        dist.all_to_all_single(recv_sizes, send_sizes, group=self.group)
        splits = recv_sizes.cpu().tolist()
        sent = torch.cat(buffers).to(self.device)
        received = torch.empty(sum(splits), dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(received, sent, output_split_sizes=splits, input_split_sizes=send_sizes.cpu().tolist(),
                               group=self.group)
        return list(received.cpu().split(splits))


class GradcompHookState:
    """What `gradcomp_hook` needs across steps: the codec, the per-bucket states, the step.

    codec: a `gradcomp.Codec` from the typed constructors (codecs.py: `gradcomp.topk(...)`,
           `gradcomp.uniform(...)`, ...), or a name of the docs' tables (`codec_names()`, the
           presets the measurements used). A codec compresses each bucket with its own state;
           `tagc(...)` (the `tagc_names()` rows) reduce-scatters every parameter through TAGC:
           dynamic sparsification, the LHC index all-reduce and sketch reduce-scatter, then the
           shards all-gathered; `gravac(...)` (`gravac_names()`) is top-k + EF, the density chosen
           by GraVAC for the whole model; `gravac_bits(...)` (`gravac_ladder_names()`) is GraVAC
           choosing a bit width for the whole model: each bucket sent by the codec of that width,
           with its bucket states, kept for the candidate's and the safe level's widths only (a
           width that stops being either drops its states); `powersgd(...)` (`powersgd_names()`)
           sends every parameter through gradcomp's PowerSGD all-reduce as a matrix, its first
           dimension × the rest, a state per parameter (docs/lowrank.md); `dense()` or "dense" is
           the process group's all-reduce.
    model: the module whose parameters DDP buckets (names key the states).
    dense_below: buckets of fewer elements go dense (the message header would outweigh them).
    record: a directory; every bucket's input and mean are appended to rank<r>.bin (for
            replay_mpi, which checks them against gradcomp's collectives over MPI).
    dense_steps: the warm-up, as PyTorch PowerSGD's start_powerSGD_iter: steps 0 .. dense_steps-1
            are uncompressed all-reduces (a codec's through gradcomp's `dense` plan, after the
            ranks' agreement), every state untouched; 0 (the default): compress from the first step.
    print_decisions: GraVAC only: log the controller's decision whenever what it sends changes
            (the path: candidate, safe or dense, or the density or width), with both gains, as the
            training demo prints its timeline; every change is also kept in `gravac_trace`.
    """

    def __init__(self, codec, model, process_group=None, extension=None, dense_below=0, record=None, log=print,
                 dense_steps=0, print_decisions=False):
        self.ext = extension if extension is not None else _gradcomp_torch
        kind, name = _kind_and_name(codec, self.ext)
        self.codec_name = name
        # A TAGC scheme keeps one state for the whole model (keyed by parameter index), a codec one
        # state per bucket.
        self.tagc = self.ext.Tagc(name) if kind == "tagc" else None
        self.tagc_state = self.tagc.make_state() if self.tagc is not None else None
        # GraVAC: one controller for the model and residuals keyed by parameter, inside the object.
        self.gravac = self.ext.Gravac(name) if kind == "gravac" else None
        # GraVAC over bit widths: one controller, and per width in use its codec and bucket states.
        self.ladder = self.ext.GravacLadder(name) if kind == "gravac_bits" else None
        self.widths = {}  # bits -> (Codec, {key: (State, sizes)}, orphans)
        self._observed = (0.0, 0.0, 0.0)  # the ladder's magnitudes of the step's buckets so far
        self.print_decisions = print_decisions
        # (first step, path, density or width sent or None, gain of the candidate, of the safe level)
        self.gravac_trace = []
        # PowerSGD: a state per parameter (keyed by its index), inside the object.
        self.powersgd = self.ext.PowerSGD(name) if kind == "powersgd" else None
        self.codec = self.ext.Codec(name) if kind == "codec" else None
        self.ops = ProcessGroupOps(process_group)
        self.dense_below = dense_below
        self.dense_steps = dense_steps
        self.record = record
        self.log = log
        # Every parameter's name and place in the model: a bucket is compressed with its
        # parameters in the model's order, so a rebuild that only reorders a bucket changes
        # nothing (neither the state's key nor its layout).
        self._names = {id(p): (index, name) for index, (name, p) in enumerate(model.named_parameters())}
        self.states = {}      # tuple of parameter names -> (bucket State, sizes)
        self._orphans = {}    # parameter name -> (worker error, server error, State it came from)
        self.step = 0         # steps completed (every bucket of a step carries this key)
        self.relaid = 0       # buckets whose state was re-laid from other buckets' states
        self.server_values_dropped = 0  # server-error values (this rank) a re-laying could not carry
        self.plans = {}       # bucket index -> the plan of its last call (codec.plan, or "dense")
        self.skipped_steps = []
        self.step_skipped = False
        self.sent_bytes = 0   # this rank, the current or last step: the messages (the library's report)
        self.wire_bytes = 0   # this rank, the current or last step: every byte the process group moved
        self._wire_start = 0  # ops.wire_bytes when the step began
        # This rank, the current or last step: seconds in the process group's calls (waits for the
        # other ranks included), and in the buckets' reductions outside them (gradcomp's encoding,
        # decoding, sums and states).
        self.wire_seconds = 0.0
        self.codec_seconds = 0.0
        self._wire_seconds_start = 0.0
        self.dense_bytes = 0
        self._in_step = False
        self._new_state = False  # the last bucket's state was made (fresh or re-laid) for it

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self):
        """The hook's state, for a training checkpoint (the process group is not part of it)."""
        if self._in_step:
            raise RuntimeError("state_dict() in the middle of a step")
        states = {}
        if self.codec is not None:
            states = {key: (self.codec.save_bucket_state(s), sizes) for key, (s, sizes) in self.states.items()}
        if self.tagc is not None:
            states = {"tagc": self.tagc.save_state(self.tagc_state)}
        if self.gravac is not None:
            states = {"gravac": self.gravac.save()}
        if self.ladder is not None:
            states = {"gravac_ladder": self.ladder.save(),
                      "widths": {bits: {key: (codec.save_bucket_state(s), sizes) for key, (s, sizes) in kept.items()}
                                 for bits, (codec, kept, _) in self.widths.items()}}
        if self.powersgd is not None:
            states = {"powersgd": self.powersgd.save()}
        return {"format": 2, "codec": self.codec_name, "step": self.step, "relaid": self.relaid,
                "server_values_dropped": self.server_values_dropped, "skipped_steps": list(self.skipped_steps),
                "states": states}

    def load_state_dict(self, saved):
        if saved.get("format") != 2 or saved.get("codec") != self.codec_name:
            raise ValueError(f"checkpoint of codec {saved.get('codec')!r} (format {saved.get('format')}), "
                             f"this hook runs {self.codec_name!r}")
        if self.tagc is not None:
            self.tagc_state = self.tagc.load_state(saved["states"]["tagc"])
        elif self.gravac is not None:
            self.gravac.load(saved["states"]["gravac"])
        elif self.ladder is not None:
            self.ladder.load(saved["states"]["gravac_ladder"])
            self.widths = {}
            for bits, kept in saved["states"]["widths"].items():
                codec, states, _ = self._width(bits)
                states.update(self._loaded_states(codec, kept))
        elif self.powersgd is not None:
            self.powersgd.load(saved["states"]["powersgd"])
        else:
            self.states = self._loaded_states(self.codec, saved["states"])
        self._orphans = {}
        self.step = saved["step"]
        self.relaid = saved["relaid"]
        self.server_values_dropped = saved["server_values_dropped"]
        self.skipped_steps = list(saved["skipped_steps"])

    def _loaded_states(self, codec, saved):
        world, rank = self.ops.size(), self.ops.rank()
        return {key: (codec.load_bucket_state(blob, sum(sizes), world, rank), sizes)
                for key, (blob, sizes) in saved.items()}

    # ---- per bucket --------------------------------------------------------------------------
    def _layout_of(self, bucket):
        """The bucket's parameters in the model's order: their names (the state's key), sizes and
        offsets in the bucket's buffer."""
        entries, offset = [], 0
        for p in bucket.parameters():
            entry = self._names.get(id(p))
            if entry is None:
                raise KeyError("a bucket holds a parameter that is not the model's")
            entries.append((entry[0], entry[1], p.numel(), offset, list(p.shape)))
            offset += p.numel()
        if offset != bucket.buffer().numel():
            raise ValueError(f"a bucket of {bucket.buffer().numel()} values holds parameters of {offset}")
        entries.sort()
        self._parameters = [(e[0], e[1], e[4]) for e in entries]  # (index, name, shape), for TAGC and PowerSGD
        return (tuple(e[1] for e in entries), [e[2] for e in entries], [e[3] for e in entries])

    def _width(self, bits):
        """The codec row of the ladder's width `bits`, its bucket states and their orphans (made
        empty the first time)."""
        if bits not in self.widths:
            self.widths[bits] = (self.ext.Codec(self.ladder.row(bits)), {}, {})
        return self.widths[bits]

    def _state_for(self, key, sizes, codec=None, states=None, orphans=None):
        """The bucket state (gradcomp_torch.cpp, bucket_state.hpp: the plan `automatic_plan` picks
        and its chunk and server states) of the bucket of parameters `key`: its own, or one re-laid
        from the states that hold its parameters, or a fresh one the first time any of them is seen.
        codec, states, orphans: a ladder width's (default: the hook's codec's)."""
        codec = self.codec if codec is None else codec
        states = self.states if states is None else states
        orphans = self._orphans if orphans is None else orphans
        self._new_state = key not in states
        if not self._new_state:
            return states[key][0]
        wanted = set(key)
        # Break up every state that holds one of this bucket's parameters.
        for old in [k for k in states if wanted.intersection(k)]:
            state, old_sizes = states.pop(old)
            worker, server = codec.bucket_errors(state)
            offset = 0
            for name, size in zip(old, old_sizes):
                orphans[name] = (worker[offset:offset + size], server[offset:offset + size], state)
                offset += size
        world, rank = self.ops.size(), self.ops.rank()
        if not wanted.intersection(orphans):
            state = codec.make_bucket_state(sum(sizes), world, rank)
        else:
            workers, servers, like = [], [], None
            for name, size in zip(key, sizes):
                if name in orphans:
                    worker, server, like = orphans.pop(name)
                else:
                    worker, server = torch.zeros(size), torch.zeros(size)
                workers.append(worker)
                servers.append(server)
            state, dropped = codec.relaid_bucket_state(torch.cat(workers).contiguous(),
                                                       torch.cat(servers).contiguous(), like, world, rank)
            self.relaid += 1
            self.server_values_dropped += dropped
            if rank == 0 or dropped:
                lost = f"; rank {rank} dropped {dropped} server-error values it no longer owns" if dropped else ""
                self.log(f"gradcomp: step {self.step}: bucket of {len(key)} parameters re-laid from earlier "
                         f"buckets' states (error carried over, not reset{lost})")
        states[key] = (state, sizes)
        return state

    def _record(self, key, bucket_index, saved_state, before, after):
        """Appends one bucket to <record>/rank<r>.bin, little-endian: u64 step, u32 bucket index,
        u64 key hash (the first 8 bytes of SHA-256 of the parameter names joined by NUL), u32 1 when
        the state was made for this call (fresh or re-laid) else 0, u64 n, u64 state bytes s, the
        saved state before the call (s bytes), the input (n float32) and the mean (n float32), both
        in the model's parameter order."""
        import hashlib
        import struct
        key_hash = struct.unpack("<Q", hashlib.sha256("\0".join(key).encode()).digest()[:8])[0]
        with open(os.path.join(self.record, f"rank{self.ops.rank()}.bin"), "ab") as f:
            f.write(struct.pack("<QIQIQQ", self.step, bucket_index, key_hash, int(self._new_state), before.numel(),
                                len(saved_state)))
            f.write(saved_state)
            f.write(before.numpy().tobytes())
            f.write(after.numpy().tobytes())

    def _begin_bucket(self):
        if not self._in_step:
            self._in_step = True
            self.step_skipped = False
            self.sent_bytes = 0
            self.wire_bytes = 0
            self._wire_start = self.ops.wire_bytes
            self.wire_seconds = 0.0
            self.codec_seconds = 0.0
            self._wire_seconds_start = self.ops.wire_seconds
            self.dense_bytes = 0
            if self.ladder is not None:
                d = self.ladder.decision
                for bits in set(self.widths) - {d["candidate_bits"], d["safe_bits"]}:
                    del self.widths[bits]  # a width tried again starts afresh (gravac_ladder.hpp)
                self._observed = (0.0, 0.0, 0.0)

    def _end_bucket(self, last):
        if last:
            for orphans in [self._orphans] + [w[2] for w in self.widths.values()]:
                if orphans:
                    lost = sorted(orphans)
                    orphans.clear()
                    self.log(f"gradcomp: step {self.step}: no bucket took the carried error of {lost}; dropped")
            if self.step_skipped:
                self.skipped_steps.append(self.step)
            self.step += 1
            self._in_step = False

    def _trace_gravac(self):
        """Records (and with print_decisions logs) the decision for the next step when what it
        sends differs from the last recorded one: the density sent (top-k GraVAC) or the width."""
        ladder = self.ladder is not None
        d = (self.ladder if ladder else self.gravac).decision
        unit = "_bits" if ladder else ""
        sent = {"candidate": d["candidate" + unit], "safe": d["safe" + unit], "dense": None}[d["send"]]
        if self.gravac_trace and self.gravac_trace[-1][1:3] == (d["send"], sent):
            return
        self.gravac_trace.append((self.step + 1, d["send"], sent, d["gain_candidate"], d["gain_safe"]))
        if self.print_decisions:
            gains = ", ".join(f"{name} {g:.3f}" for name, g in (("candidate", d["gain_candidate"]),
                                                                 ("safe", d["gain_safe"])) if g is not None)
            what = "dense" if sent is None else f"{sent}-bit" if ladder else f"top-k θ = {sent:g}"
            candidate = f"{d['candidate_bits']} bits" if ladder else f"θ = {d['candidate']:g}"
            self.log(f"GraVAC from step {self.step + 1}: {what} ({d['send']}; gain {gains or 'not yet measured'}; "
                     f"candidate {candidate}{', searching' if d['searching'] else ''})")

    def _reduce_ladder(self, data, key, sizes, bucket, dense):
        """One bucket through the GraVAC ladder: its magnitudes measured, then sent as the
        decision says (the width's codec row with its bucket states, or dense). Returns the bytes
        sent; raises GradcompError non_finite_input on every rank alike for NaN/Inf."""
        d = self.ladder.decision
        observed = self.ladder.measure(data, sizes, self.step, bucket.index())
        if d["send"] == "dense":
            self.plans[bucket.index()] = "dense"
            self._dense_mean(data)
            sent = dense
        else:
            bits = d["candidate_bits"] if d["send"] == "candidate" else d["safe_bits"]
            codec, states, orphans = self._width(bits)
            state = self._state_for(key, sizes, codec, states, orphans)
            self.plans[bucket.index()] = f"{codec.plan(data.numel(), self.ops.size())}, {bits} bits"
            sent = codec.all_reduce_mean(self.ops, data, state, step=self.step, tensor_id=bucket.index())["sent_bytes"]
        self._observed = tuple(a + b for a, b in zip(self._observed, observed))
        return sent

    def _dense_mean(self, data):
        """`data` becomes its mean over the ranks by the process group's all-reduce; NaN/Inf on any
        rank raises GradcompError non_finite_input on every rank."""
        if not torch.isfinite(data).all():
            data.fill_(float("nan"))  # every rank's sum turns NaN: caught below on every rank
        self.ops.all_reduce_sum(data)
        if not torch.isfinite(data).all():
            raise self.ext.GradcompError("non_finite_input", "non_finite_input: a rank's bucket holds NaN or Inf")
        data /= self.ops.size()

    def reduce(self, bucket):
        """The mean of `bucket` over the ranks, as a new CPU tensor (the hook's work)."""
        self._begin_bucket()
        buffer = bucket.buffer().detach()
        key, sizes, offsets = self._layout_of(bucket)
        data = _staged_to_host(torch.cat([buffer[o:o + n] for o, n in zip(offsets, sizes)]))
        before = data.clone() if self.record else None
        saved = b""
        self._new_state = False
        world = self.ops.size()
        dense = 2 * (world - 1) * data.numel() * 4 // world
        warm_up = self.step < self.dense_steps
        start, wire_before = time.perf_counter(), self.ops.wire_seconds
        try:
            if self.gravac is not None and not warm_up:
                params = [(index, size) for (index, _, _), size in zip(self._parameters, sizes)]
                self.plans[bucket.index()] = "gravac"
                report = self.gravac.all_reduce_mean(self.ops, data, params, self.step, bucket.index(), bucket.is_last())
                self.sent_bytes += report["sent_bytes"]
                if bucket.is_last():
                    self._trace_gravac()
            elif self.ladder is not None and not warm_up:
                self.sent_bytes += self._reduce_ladder(data, key, sizes, bucket, dense)
            elif self.powersgd is not None:
                self.plans[bucket.index()] = "dense" if warm_up else "low_rank"
                report = self.powersgd.all_reduce_mean(self.ops, data, self._parameters, self.step, self.dense_steps)
                self.sent_bytes += report["sent_bytes"]
            elif self.tagc is not None and not warm_up:
                self.plans[bucket.index()] = "tagc"
                report = self.tagc.all_reduce_mean(self.ops, data, self.tagc_state, self._parameters)
                self.sent_bytes += report["sent_bytes"]
                if not torch.isfinite(data).all():  # through a tensor TAGC's policy sends uncompressed
                    raise self.ext.GradcompError("non_finite_input", "non_finite_input: a rank's bucket holds NaN or Inf")
            elif self.codec is None or data.numel() < self.dense_below:
                self.plans[bucket.index()] = "dense"
                self._dense_mean(data)
                self.sent_bytes += dense
            else:
                state = self._state_for(key, sizes)
                saved = self.codec.save_bucket_state(state) if self.record else b""
                self.plans[bucket.index()] = "dense" if warm_up else self.codec.plan(data.numel(), world)
                report = self.codec.all_reduce_mean(self.ops, data, state, step=self.step, tensor_id=bucket.index(),
                                                    dense_steps=self.dense_steps)
                self.sent_bytes += report["sent_bytes"]
            self.dense_bytes += dense
        except self.ext.GradcompError as e:
            if e.args[0] != "non_finite_input":
                raise
            # Every rank raised it in the same call (the agreement record carries the flag):
            # this bucket sends nothing and every rank skips the step.
            data.zero_()
            self.step_skipped = True
        self.codec_seconds += time.perf_counter() - start - (self.ops.wire_seconds - wire_before)
        if self.record:
            self._record(key, bucket.index(), saved, before, data)
        if self.ladder is not None and not warm_up and bucket.is_last() and not self.step_skipped:
            # Every rank alike (the skip is agreed): the step's magnitudes over the ranks, the next decision.
            self.ladder.end_step(self.ops, self._observed, self.sent_bytes)
            self._trace_gravac()
        self.wire_bytes = self.ops.wire_bytes - self._wire_start
        self.wire_seconds = self.ops.wire_seconds - self._wire_seconds_start
        self._end_bucket(bucket.is_last())
        mean = torch.empty_like(data)
        position = 0
        for o, n in zip(offsets, sizes):
            mean[o:o + n] = data[position:position + n]
            position += n
        return mean


def _staged_to_host(tensor):
    """`tensor` as a contiguous float32 CPU tensor. The extension has no CUDA backend yet, so a
    CUDA (or non-float32) gradient is copied, and the first such copy in the process says so
    (docs/pytorch.md §7): never a silent copy."""
    if (tensor.is_cuda or tensor.dtype != torch.float32) and not _staged_to_host.warned:
        _staged_to_host.warned = True
        warnings.warn(f"gradcomp: {tensor.dtype} gradients on {tensor.device} are copied into float32 host memory "
                      "for the CPU codecs and the mean copied back (no CUDA or 16-bit path in the PyTorch package yet)",
                      stacklevel=3)
    return tensor.to("cpu", torch.float32).contiguous()


_staged_to_host.warned = False


def _kind_and_name(codec, ext):
    """What GradcompHookState runs for `codec` (a gradcomp.Codec or a preset's name): its kind
    ("dense", "codec", "tagc", "gravac", "gravac_bits", "powersgd") and the name the extension
    builds it from (the Codec's spec, or the preset's name)."""
    if isinstance(codec, Codec):
        return codec.kind, codec.spec
    if not isinstance(codec, str):
        raise TypeError(f"codec must be a gradcomp.Codec (gradcomp.topk(...), ...) or a preset's name, got {codec!r}")
    if codec == DENSE:
        return "dense", DENSE
    for kind, names in (("tagc", ext.tagc_names()), ("gravac", ext.gravac_names()),
                        ("gravac_bits", ext.gravac_ladder_names()), ("powersgd", ext.powersgd_names())):
        if codec in names:
            return kind, codec
    return "codec", codec  # a codec preset, or an error from the extension naming what is wrong


def gradcomp_hook(state, bucket):
    """DDP communication hook: the bucket becomes its compressed mean over the ranks."""
    mean = state.reduce(bucket)
    buffer = bucket.buffer()
    buffer.copy_(mean)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future
