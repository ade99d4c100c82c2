"""gradcomp codecs as a communication hook of FSDP (FullyShardedDataParallel, the FSDP1 API).

    import gradcomp
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    model = FSDP(model, device_id=torch.device("cpu"))          # CPU and gloo: torch 2.x
    hook = gradcomp.FSDPHookState(gradcomp.tagc(zero_fraction=0.95), model)
    model.register_comm_hook(hook, gradcomp.fsdp_hook)

FSDP calls the hook once per FSDP unit in every backward pass, always in the same order, with the
unit's flat gradient (its parameters one after another, padded with zeros to a multiple of P) and
this rank's shard of it to fill. The hook makes the shard the mean over the ranks with gradcomp's
`compressed_reduce_scatter`: a codec's `all_to_all` plan with P chunk states per unit for error
feedback and LoCo (its automatic plan for a stateless codec), or one TAGC reduce-scatter of the
flat gradient with TAGC's residual per unit (`tagc(...)`: the deployment of TAGC's paper). FSDP's
shards are gradcomp's chunks (`ring_chunk_of` of a multiple of P: P equal chunks in rank order).

A unit is known by its place in the call order (its `tensor_id` in the message key) and the size of
its flat gradient, checked at every call; a step is one call per unit. So every unit must reduce a
gradient every step (FSDP does so for a unit with any trainable parameter). NaN or Inf in any rank's
gradient raises non_finite_input on every rank alike: the shard is zeroed and `step_skipped` set,
as in the DDP hook. Sharding strategies that reduce-scatter (FULL_SHARD, SHARD_GRAD_OP) call this
hook; NO_SHARD calls it with one argument and is refused. `state_dict()` / `load_state_dict()`
put the units' states in a checkpoint; a resumed run continues bit for bit.
"""

import time

import torch

from . import _gradcomp_torch
from .ddp import ProcessGroupOps, _kind_and_name, _staged_to_host


class FSDPHookState:
    """What `fsdp_hook` needs across calls: the codec or TAGC, a state per FSDP unit, the step.

    codec: a `gradcomp.Codec` of kind "codec" (`topk(...)`, `uniform(...)`, ...), `tagc(...)` or
           `dense()` (an uncompressed reduce-scatter through the same agreement), or a preset's name.
    model: the FSDP-wrapped model (its units are counted: one hook call per unit and step).
    dense_steps: the warm-up: steps 0 .. dense_steps-1 are uncompressed reduce-scatters, the states
           untouched (TAGC: the process group's own).
    """

    def __init__(self, codec, model, process_group=None, extension=None, dense_steps=0):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        self.ext = extension if extension is not None else _gradcomp_torch
        kind, name = _kind_and_name(codec, self.ext)
        if kind not in ("codec", "tagc", "dense"):
            raise ValueError(f"the FSDP hook runs a codec, tagc(...) or dense(), not {kind} ({name!r})")
        self.codec_name = name
        self.codec = self.ext.Codec(name) if kind == "codec" else None
        self.tagc = self.ext.Tagc(name) if kind == "tagc" else None
        self.tagc_state = self.tagc.make_state() if self.tagc is not None else None
        self.ops = ProcessGroupOps(process_group)
        self.dense_steps = dense_steps
        # The units FSDP reduces: those holding parameters that take gradients.
        self.units = sum(1 for unit in FSDP.fsdp_modules(model)
                         if any(p.requires_grad for p in unit.module.parameters(recurse=False)))
        if self.units == 0:
            raise ValueError("the model has no FSDP unit with trainable parameters")
        self.sizes = {}       # unit -> the size of its flat gradient (checked at every call)
        self.states = {}      # unit -> its P chunk states (a stateful codec)
        self.calls = 0        # hook calls so far
        self.step = 0         # steps completed
        self.skipped_steps = []
        self.step_skipped = False
        self.sent_bytes = 0   # this rank, the current or last step: the messages
        self.wire_bytes = 0   # this rank, the current or last step: every byte the process group moved
        self._wire_start = 0
        # This rank, the current or last step: seconds in the process group's calls and in the
        # units' reductions outside them (as GradcompHookState's).
        self.wire_seconds = 0.0
        self.codec_seconds = 0.0
        self._wire_seconds_start = 0.0

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self):
        """The hook's state, for a training checkpoint: the codec, the counters, each unit's size and
        its chunk states (a stateful codec) or TAGC's state."""
        if self.calls % self.units:
            raise RuntimeError("state_dict() in the middle of a step")
        states = {}
        if self.codec is not None and self.codec.stateful:
            states = {unit: self.codec.save_chunk_states(s) for unit, s in self.states.items()}
        if self.tagc is not None:
            states = {"tagc": self.tagc.save_state(self.tagc_state)}
        return {"format": 1, "codec": self.codec_name, "units": self.units, "ranks": self.ops.size(),
                "step": self.step, "sizes": dict(self.sizes), "skipped_steps": list(self.skipped_steps),
                "states": states}

    def load_state_dict(self, saved):
        """Restores `state_dict()`'s state (of the same codec, number of units and P)."""
        mine = (1, self.codec_name, self.units, self.ops.size())
        theirs = (saved.get("format"), saved.get("codec"), saved.get("units"), saved.get("ranks"))
        if theirs != mine:
            raise ValueError(f"checkpoint of (format, codec, units, ranks) {theirs}, this hook has {mine}")
        self.sizes = dict(saved["sizes"])
        if self.tagc is not None:
            self.tagc_state = self.tagc.load_state(saved["states"]["tagc"])
        elif self.codec is not None and self.codec.stateful:
            self.states = {unit: self.codec.load_chunk_states(blob, self.sizes[unit], self.ops.size())
                           for unit, blob in saved["states"].items()}
        self.step = saved["step"]
        self.calls = self.step * self.units
        self.skipped_steps = list(saved["skipped_steps"])

    # ---- per unit ----------------------------------------------------------------------------
    def reduce_scatter(self, grad, output):
        """`output` (this rank's shard of `grad`) becomes that shard of the mean over the ranks."""
        unit = self.calls % self.units
        if unit == 0:
            self.step_skipped = False
            self.sent_bytes = 0
            self._wire_start = self.ops.wire_bytes
            self.codec_seconds = 0.0
            self._wire_seconds_start = self.ops.wire_seconds
        n, world = grad.numel(), self.ops.size()
        if self.sizes.setdefault(unit, n) != n:
            raise RuntimeError(f"FSDP unit {unit} reduced {n} values, {self.sizes[unit]} before: the units were "
                               "not called in the order this state expects (does every unit take a gradient?)")
        if output.numel() * world != n:
            raise ValueError(f"a shard of {output.numel()} values of a flat gradient of {n} at P = {world}")
        data = _staged_to_host(grad.detach())
        out = torch.empty(output.numel(), dtype=torch.float32)
        warm_up = self.step < self.dense_steps
        start, wire_before = time.perf_counter(), self.ops.wire_seconds
        try:
            if self.tagc is not None and not warm_up:
                report = self.tagc.reduce_scatter_mean(self.ops, data, out, self.tagc_state, self.step, unit)
            elif self.codec is not None:
                states = None
                if self.codec.stateful:
                    states = self.states.get(unit)
                    if states is None:
                        states = self.states[unit] = self.codec.make_chunk_states(n, world)
                report = self.codec.reduce_scatter_mean(self.ops, data, out, states, step=self.step, tensor_id=unit,
                                                        dense_steps=self.dense_steps)
            else:
                report = self._dense_shard(data, out)
            self.sent_bytes += report["sent_bytes"]
        except self.ext.GradcompError as e:
            if e.args[0] != "non_finite_input":
                raise
            out.zero_()  # every rank raised it in the same call: every rank skips the step
            self.step_skipped = True
        self.codec_seconds += time.perf_counter() - start - (self.ops.wire_seconds - wire_before)
        output.copy_(out)
        self.wire_bytes = self.ops.wire_bytes - self._wire_start
        self.wire_seconds = self.ops.wire_seconds - self._wire_seconds_start
        self.calls += 1
        if self.calls % self.units == 0:
            if self.step_skipped:
                self.skipped_steps.append(self.step)
            self.step += 1

    def _dense_shard(self, data, out):
        """The process group's reduce-scatter of `data` into `out`, divided by P; NaN/Inf on any rank
        raises GradcompError non_finite_input on every rank."""
        if not torch.isfinite(data).all():
            data.fill_(float("nan"))
        self.ops.reduce_scatter_sum(data, out)
        if not torch.isfinite(out).all():
            raise self.ext.GradcompError("non_finite_input", "non_finite_input: a rank's gradient holds NaN or Inf")
        out /= self.ops.size()
        return {"sent_bytes": (self.ops.size() - 1) * out.numel() * 4}


def fsdp_hook(state, grad, output=None):
    """FSDP1 communication hook (register_comm_hook(state, fsdp_hook)): `output`, this rank's shard,
    becomes the compressed mean of `grad`'s shard over the ranks."""
    if output is None:
        raise ValueError("the gradcomp FSDP hook reduce-scatters: use a sharding strategy that shards gradients "
                         "(FULL_SHARD, SHARD_GRAD_OP), not NO_SHARD")
    state.reduce_scatter(grad, output)
