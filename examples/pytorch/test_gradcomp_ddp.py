"""Checks of the extension and the hook state (the training runs are train_ddp.py and replay_mpi):
the codecs round-trip through Python, errors arrive as GradcompError with gradcomp's code, and the
per-bucket states survive reordered and rebuilt buckets and checkpoints, on a world of one rank;
and over gloo at P = 2, 3, 4 (ScatterReduceHookTest, spawned ranks) the hook's plans, bytes, means
and states against gradcomp's scatter_reduce in process, and TAGC's re-sparsified gather at P = 3
(TagcGatherTest). Buckets here are stand-ins with DDP's
GradBucket methods."""

import math
import os
import struct
import sys
import tempfile
import time
import unittest

import torch
import torch.distributed as dist

import gradcomp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lm"))
import gravac_gains  # noqa: E402  (the quantizer oracle of the ladder's gain)

EXT = gradcomp.extension()


class Bucket:
    """What the hook uses of torch.distributed.GradBucket: the flat gradients of `params` in order."""

    def __init__(self, index, params, grads, last):
        self._index, self._params, self._last = index, params, last
        self._buffer = torch.cat([grads[id(p)].flatten() for p in params])

    def buffer(self):
        return self._buffer

    def parameters(self):
        return self._params

    def index(self):
        return self._index

    def gradients(self):
        """Views of the buffer, one per parameter, in its shape (PyTorch's powerSGD_hook writes
        through them)."""
        views, offset = [], 0
        for p in self._params:
            views.append(self._buffer[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        return views

    def is_last(self):
        return self._last


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))


def dyadic_gradients(m, step, rank=0):
    """Gradients of multiples of 1/64 in [-4, 4): every sum the checks make is exact in float."""
    g = torch.Generator().manual_seed(100 + step + 1000 * rank)
    return {id(p): (torch.randint(-256, 256, p.shape, generator=g).float() / 64) for p in m.parameters()}


def run_step(hook, m, layout, step, rank=0):
    """One step: the buckets of `layout` (lists of parameter positions), each reduced by the hook.
    Returns the means by parameter position, and the gradients (rank `rank`'s)."""
    params = list(m.parameters())
    grads = dyadic_gradients(m, step, rank)
    means = {}
    for index, positions in enumerate(layout):
        bucket = Bucket(index, [params[i] for i in positions], grads, index == len(layout) - 1)
        mean = gradcomp.gradcomp_hook(hook, bucket).wait()
        offset = 0
        for i in positions:
            means[i] = mean[offset:offset + params[i].numel()].clone()
            offset += params[i].numel()
    return means, [grads[id(p)].flatten() for p in params]


def errors_by_parameter(hook):
    """The errors the bucket states carry, by parameter name: (worker error, server error)."""
    out = {}
    for key, (state, sizes) in hook.states.items():
        worker, server = hook.codec.bucket_errors(state)
        offset = 0
        for name, size in zip(key, sizes):
            out[name] = (worker[offset:offset + size].clone(), server[offset:offset + size].clone())
            offset += size
    return out


def carried_by_parameter(hook, m):
    """The error every parameter's state carries, by parameter name (one rank: no server state)."""
    errors = errors_by_parameter(hook)
    assert not any(server.any() for _, server in errors.values())
    return {name: worker for name, (worker, _) in errors.items()}


class ExtensionTest(unittest.TestCase):
    def test_codec_names_are_the_table_rows(self):
        names = EXT.codec_names()
        for name in ["top-k 1% + EF", "uniform 4-bit + LoCo", "QSGD 7 levels", "ZFP R=8"]:
            self.assertIn(name, names)

    def test_rows_the_hook_cannot_run_are_refused_with_the_reason(self):
        refused = EXT.refused_rows()
        self.assertEqual(sorted(refused), ["MPC ring all-reduce (lossless)", "ZFP R=8 ring all-reduce",
                                           "count sketch 3x512 + 5% exact + EF"])
        for name, why in refused.items():
            self.assertNotIn(name, EXT.codec_names())
            with self.assertRaises(EXT.GradcompError) as caught:
                EXT.Codec(name)
            self.assertEqual(caught.exception.args[0], "invalid_argument")
            self.assertIn(why, caught.exception.args[1])
        with self.assertRaises(EXT.GradcompError) as caught:
            EXT.Codec("no such row")
        self.assertIn("no codec row named", str(caught.exception))

    def test_round_trip_and_accumulate(self):
        x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
        codec = EXT.Codec("uniform 4-bit")
        self.assertFalse(codec.stateful)
        message = codec.encode(x, step=3, tensor_id=2)
        self.assertEqual(message.dtype, torch.uint8)
        self.assertLess(message.numel(), x.numel())  # 4 bits per value and per-block scales
        decoded = codec.decode(message, 1000)
        step = (x.abs().max() / 7).item()  # 4 bits: 7 levels each side, a bound on every block's step
        self.assertLessEqual((decoded - x).abs().max().item(), step / 2 * (1 + 1e-6))
        acc = torch.ones(1000)
        codec.decode_accumulate(message, acc)
        self.assertTrue(torch.equal(acc, torch.ones(1000) + decoded))

    def test_errors_carry_gradcomp_codes(self):
        codec = EXT.Codec("top-k 1%")
        message = codec.encode(torch.randn(500))
        with self.assertRaises(EXT.GradcompError) as caught:
            codec.decode(message[:-3].clone(), 500)
        self.assertEqual(caught.exception.args[0], "truncated")
        with self.assertRaises(EXT.GradcompError) as caught:
            codec.decode(message, 499)
        self.assertEqual(caught.exception.args[0], "size_mismatch")
        with self.assertRaises(EXT.GradcompError) as caught:
            codec.encode(torch.tensor([1.0, float("nan")]))
        self.assertEqual(caught.exception.args[0], "non_finite_input")
        with self.assertRaises(EXT.GradcompError) as caught:
            EXT.Codec("no such codec")
        self.assertEqual(caught.exception.args[0], "invalid_argument")
        with self.assertRaises(EXT.GradcompError) as caught:
            codec.encode(torch.zeros(4, dtype=torch.float64))
        self.assertEqual(caught.exception.args[0], "invalid_argument")

    def test_stateful_encode_and_saved_state(self):
        codec = EXT.Codec("top-k 1% + EF")
        self.assertTrue(codec.stateful)
        state = codec.make_state(1000)
        x = torch.randn(1000, generator=torch.Generator().manual_seed(2))
        message = codec.encode(x, state)
        # Error feedback: decoded + carried error == input, exactly for top-k.
        self.assertTrue(torch.equal(codec.decode(message, 1000) + codec.carried_error(state), x))
        saved = codec.save_state(state)
        restored = codec.load_state(saved, 1000)
        self.assertEqual(codec.save_state(restored), saved)
        with self.assertRaises(EXT.GradcompError) as caught:
            codec.load_state(saved[:-1], 1000)
        self.assertEqual(caught.exception.args[0], "truncated")
        with self.assertRaises(EXT.GradcompError) as caught:
            codec.load_state(saved, 999)
        self.assertEqual(caught.exception.args[0], "size_mismatch")
        with self.assertRaises(EXT.GradcompError) as caught:
            codec.encode(x[:999].clone(), state)
        self.assertEqual(caught.exception.args[0], "size_mismatch")

    def test_decayed_error_feedback_row(self):
        plain, decayed = EXT.Codec("top-k 1% + EF"), EXT.Codec("top-k 1% + EF decay 0.9")
        p, d = plain.make_state(1000), decayed.make_state(1000)
        x = torch.randn(1000, generator=torch.Generator().manual_seed(3))
        self.assertTrue(torch.equal(decayed.encode(x, d), plain.encode(x, p)))  # top-k's own message
        # The residual is 0.9f times plain error feedback's, each product rounded in float32.
        beta = torch.tensor(0.9, dtype=torch.float32)
        self.assertTrue(torch.equal(decayed.carried_error(d), plain.carried_error(p) * beta))
        with self.assertRaises(EXT.GradcompError) as caught:
            plain.load_state(decayed.save_state(d), 1000)  # a state saved with another decay
        self.assertEqual(caught.exception.args[0], "parameter_mismatch")


class HookStateTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.store = tempfile.TemporaryDirectory()
        init = "file://" + os.path.join(cls.store.name, "store")
        dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()
        cls.store.cleanup()

    def hook(self, codec, m, **kwargs):
        self.logged = []
        return gradcomp.GradcompHookState(codec, m, extension=EXT, log=self.logged.append, **kwargs)

    def test_reordered_bucket_keeps_its_state(self):
        m = model()
        hook = self.hook("uniform 4-bit + LoCo", m)
        run_step(hook, m, [[3, 2, 1, 0]], 0)
        (key, (state, _)), = hook.states.items()
        run_step(hook, m, [[1, 0, 3, 2]], 1)  # DDP's rebuild in the order gradients became ready
        self.assertEqual(hook.relaid, 0)
        self.assertEqual(list(hook.states), [key])
        self.assertIs(hook.states[key][0], state)

    def test_rebuilt_buckets_carry_error_feedback_exactly(self):
        # Error feedback with top-k: Σ_t mean_t + e_T = Σ_t g_t, exactly with these gradients, only
        # if no bucket rebuild drops or moves an element's residual.
        m = model()
        hook = self.hook("top-k 1% + EF", m)
        layouts = [[[3, 2], [1, 0]], [[3], [2, 1, 0]], [[0, 3], [2], [1]], [[3, 2, 1, 0]]]
        n = len(list(m.parameters()))
        sent = [torch.zeros(p.numel()) for p in m.parameters()]
        given = [torch.zeros(p.numel()) for p in m.parameters()]
        for step in range(12):
            means, grads = run_step(hook, m, layouts[min(step, 3)], step)
            for i in range(n):
                sent[i] += means[i]
                given[i] += grads[i]
        # Step 1: both buckets new (2); step 2: all three (3); step 3: the one bucket (1).
        self.assertEqual(hook.relaid, 6)
        self.assertEqual(sum("re-laid" in line for line in self.logged), 6)
        carried = carried_by_parameter(hook, m)
        for i, (name, _) in enumerate(m.named_parameters()):
            self.assertTrue(torch.equal(sent[i] + carried[name], given[i]), name)

    def test_rebuilt_buckets_carry_loco_error_within_half_a_step(self):
        m = model()
        hook = self.hook("uniform 4-bit + LoCo", m)
        for step in range(3):
            run_step(hook, m, [[3, 2], [1, 0]], step)
        before = carried_by_parameter(hook, m)
        (old_state, _), = [v for k, v in hook.states.items() if "1.bias" in k]
        # A bucket state of one LoCo state: u32 count, u64 size, then LoCo's state (t and total steps at 17).
        counters = EXT.Codec("uniform 4-bit + LoCo").save_bucket_state(old_state)[12 + 17:12 + 33]
        params = list(m.parameters())
        sizes = [params[i].numel() for i in (0, 3)]
        state = hook._state_for(("0.weight", "1.bias"), sizes)
        self.assertEqual(hook.relaid, 1)
        self.assertEqual(hook.codec.save_bucket_state(state)[12 + 17:12 + 33], counters)
        error, _ = hook.codec.bucket_errors(state)
        parts = [before["0.weight"], before["1.bias"]]
        wanted = torch.cat(parts)
        # One 8-bit scale per group of 256 over the new layout: the step is max|e| / 127.
        half_step = wanted.abs().max().item() / 127 / 2
        self.assertLessEqual((error - wanted).abs().max().item(), half_step * (1 + 1e-6))

    def test_checkpoint_continues_bit_identically(self):
        m = model()
        layout = [[3, 2], [1, 0]]
        first = self.hook("uniform 4-bit + LoCo", m)
        for step in range(4):
            run_step(first, m, layout, step)
        saved = first.state_dict()
        second = self.hook("uniform 4-bit + LoCo", m)
        second.load_state_dict(saved)
        self.assertEqual(second.step, 4)
        for step in range(4, 8):
            a, _ = run_step(first, m, layout, step)
            b, _ = run_step(second, m, layout, step)
            for i in a:
                self.assertTrue(torch.equal(a[i], b[i]))
        self.assertEqual(first.state_dict(), second.state_dict())
        with self.assertRaises(ValueError):
            self.hook("top-k 1% + EF", m).load_state_dict(saved)

    def test_non_finite_bucket_skips_the_step_and_keeps_the_state(self):
        # The GraVAC ladder too: its controller does not move, and its width's states stay.
        for name in ["top-k 1% + EF", "GraVAC uniform 4..1 bits, blocks of 64 + LoCo beta 0.95"]:
            m = model()
            hook = self.hook(name, m)
            run_step(hook, m, [[3, 2, 1, 0]], 0)
            before = hook.state_dict()
            params = list(m.parameters())
            grads = dyadic_gradients(m, 1)
            grads[id(params[2])][0, 0] = float("nan")
            mean = gradcomp.gradcomp_hook(hook, Bucket(0, params[::-1], grads, True)).wait()
            self.assertTrue(hook.step_skipped)
            self.assertEqual(hook.skipped_steps, [1])
            self.assertTrue(torch.equal(mean, torch.zeros_like(mean)))
            after = hook.state_dict()
            self.assertEqual(after["states"], before["states"], name)
            run_step(hook, m, [[3, 2, 1, 0]], 2)
            self.assertFalse(hook.step_skipped)

    def test_dense_below_sends_small_buckets_uncompressed(self):
        m = model()
        hook = self.hook("top-k 1% + EF", m, dense_below=10)
        means, grads = run_step(hook, m, [[3], [2, 1, 0]], 0)
        self.assertTrue(torch.equal(means[3], grads[3]))  # 3 values: dense, exact on one rank
        self.assertEqual(list(hook.states), [("0.weight", "0.bias", "1.weight")])

    def test_dense_steps_warm_up_then_compress(self):
        # One rank: the dense mean is the gradient itself; top-k 1% of 53 values keeps one.
        m = model()
        hook = self.hook("top-k 1% + EF", m, dense_steps=2)
        for step in range(2):
            means, grads = run_step(hook, m, [[3, 2], [1, 0]], step)
            for i in means:
                self.assertTrue(torch.equal(means[i], grads[i]))
            for name, error in carried_by_parameter(hook, m).items():
                self.assertEqual(int(torch.count_nonzero(error)), 0, name)
        means, grads = run_step(hook, m, [[3, 2], [1, 0]], 2)
        self.assertFalse(all(torch.equal(means[i], grads[i]) for i in means))
        self.assertTrue(any(int(torch.count_nonzero(e)) > 0 for e in carried_by_parameter(hook, m).values()))
        # A scheme (TAGC) warms up through the process group's all-reduce, its state untouched.
        tagc = self.hook("TAGC f*=0.95 (sharded)", m, dense_steps=1)
        before = tagc.state_dict()["states"]
        means, grads = run_step(tagc, m, [[3, 2, 1, 0]], 0)
        for i in means:
            self.assertTrue(torch.equal(means[i], grads[i]))
        self.assertEqual(tagc.state_dict()["states"], before)

    def check_state_follows_parameters(self, name, steps, sparse_weight):
        # TAGC and GraVAC sparsify bucket by bucket (TAGC keys its residuals by the bucket's set of
        # parameter ids), so a hook fed the same layout reproduces the other's means bit for bit,
        # and a checkpoint restored into a new hook continues bit for bit.
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 10))
        steady, moving = self.hook(name, m), self.hook(name, m)
        for step in range(steps):
            a, grads = run_step(steady, m, [[3, 2, 1, 0]], step)
            b, _ = run_step(moving, m, [[3, 2, 1, 0]], step)
            for i in a:
                self.assertTrue(torch.equal(a[i], b[i]), (step, i))
            kept = int((a[0] != 0).sum())
            if sparse_weight:  # what the weight drops stays in its residual
                self.assertLess(kept, 0.2 * a[0].numel())
            self.assertGreater(kept, 0)
        resumed = self.hook(name, m)
        resumed.load_state_dict(moving.state_dict())
        for step in range(steps, steps + 3):
            a, _ = run_step(moving, m, [[3, 2, 1, 0]], step)
            b, _ = run_step(resumed, m, [[3, 2, 1, 0]], step)
            for i in a:
                self.assertTrue(torch.equal(a[i], b[i]))

    def test_tagc_reproduces_and_resumes(self):
        self.assertIn("TAGC f*=0.95 (sharded)", EXT.tagc_names())
        self.check_state_follows_parameters("TAGC f*=0.95 (sharded)", 8, sparse_weight=True)

    def test_tagc_resparsified_gather_keeps_what_it_does_not_send(self):
        # One rank: the owner's shard is the whole compressed part (the two weights, in the model's
        # order, as the hook passes a bucket's parameters), and TAGC's own residuals do not depend on
        # the gather, so the lossless row's mean is the shard the re-sparsified row starts from. That
        # row sends the m − ⌊0.95·m⌋ values of shard + residual of largest magnitude, exactly, and
        # keeps the rest as the owner's residual. m = 60·128 + 128·10 = 8,960, a multiple of 20:
        # exactly 448 values (a k computed as ⌈(1 − 0.95)·m⌉ in doubles would be 449).
        name = "TAGC f*=0.95 (sharded), re-sparsified gather"
        self.assertIn(name, EXT.tagc_names())
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(60, 128), torch.nn.Linear(128, 10))
        lossless, resparsified = self.hook("TAGC f*=0.95 (sharded)", m), self.hook(name, m)
        residual = torch.zeros(10 * 128 + 128 * 60)
        for step in range(4):
            shard, _ = run_step(lossless, m, [[3, 2, 1, 0]], step)
            sent, _ = run_step(resparsified, m, [[3, 2, 1, 0]], step)
            for i in (1, 3):  # the biases: dense, exact in both rows
                self.assertTrue(torch.equal(shard[i], sent[i]))
            a = torch.cat([shard[0], shard[2]]) + residual
            s = torch.cat([sent[0], sent[2]])
            kept = s != 0
            self.assertEqual(int(kept.sum()), 448)
            self.assertTrue(torch.equal(s[kept], a[kept]))
            self.assertGreaterEqual(a[kept].abs().min().item(), a[~kept].abs().max().item())
            residual = a - s
            (carried,) = resparsified.tagc.owner_residuals(resparsified.tagc_state).values()
            self.assertTrue(torch.equal(carried, residual), step)
        self.assertEqual(lossless.tagc.owner_residuals(lossless.tagc_state), {})
        saved = resparsified.state_dict()["states"]["tagc"]
        # The layout of gradcomp_torch.cpp's tagc_scheme: "GTHS", u16 version, u64 size of TAGC's
        # state, that state, u32 count, then key (u32), m (u64) and m float32 per residual.
        tagc_size = int.from_bytes(saved[6:14], "little")
        residual_at = 14 + tagc_size + 4 + 4 + 8
        nan = saved[:residual_at] + struct.pack("<f", float("nan")) + saved[residual_at + 4:]
        entry = saved[14 + tagc_size + 4:]
        twice = saved[:14 + tagc_size] + struct.pack("<I", 2) + entry + entry
        for bad, code in [(saved[:-1], "truncated"), (saved + b"\0", "trailing_bytes"),
                          (saved[:4] + b"\x02\x00" + saved[6:], "unsupported_version"),
                          (nan, "malformed_payload"), (twice, "malformed_payload")]:
            with self.assertRaises(EXT.GradcompError) as caught:
                resparsified.tagc.load_state(bad)
            self.assertEqual(caught.exception.args[0], code)
        with self.assertRaises(EXT.GradcompError) as caught:  # owner residuals into the lossless row
            lossless.tagc.load_state(saved)
        self.assertEqual(caught.exception.args[0], "invalid_argument")
        # A state saved before the owner residuals existed (TAGC's own saved state alone) loads.
        before = lossless.state_dict()["states"]["tagc"]
        restored = lossless.tagc.load_state(before[14:-4])  # without magic, version, size and count
        self.assertEqual(lossless.tagc.save_state(restored), before)
        self.check_state_follows_parameters(name, 8, sparse_weight=True)

    def test_gravac_searches_and_resumes(self):
        name = "GraVAC top-k 10%..0.1% + EF"
        self.assertIn(name, EXT.gravac_names())
        m = model()
        hook = self.hook(name, m)
        self.assertEqual(hook.gravac.density, 0.1)  # the search starts at θ_min
        self.assertEqual(hook.gravac.candidate, 0.1)
        for step in range(60):  # three windows of 20 steps
            run_step(hook, m, [[3, 2, 1, 0]], step)
        self.assertLess(hook.gravac.candidate, 0.1)  # it moved on to sparser candidates
        self.check_state_follows_parameters(name, 45, sparse_weight=False)
        with self.assertRaises(EXT.GradcompError) as caught:
            hook.gravac.load(hook.gravac.save()[:-1])
        self.assertEqual(caught.exception.args[0], "truncated")

    def test_gravac_back_off_row_backs_off_and_prints_its_decisions(self):
        name = "GraVAC top-k 10%..0.1% + EF, back-off"
        self.assertIn(name, EXT.gravac_names())
        m = model()
        hook = self.hook(name, m, print_decisions=True)
        seen = []  # (step, decision for the next step)
        for step in range(60):  # three windows of 20 steps
            run_step(hook, m, [[3, 2, 1, 0]], step)
            seen.append((step + 1, hook.gravac.decision))
        # Uniform gradients: top-k keeps far less than 0.75 of their norm without the residual, so
        # the 5% candidate of window 2 fails at its end (step 40) and θ_cur goes back to θ_min,
        # where it stays (the row without back-off searches on: test_gravac_searches_and_resumes).
        for step, d in seen:
            self.assertEqual(d["candidate"], 0.05 if 20 <= step < 40 else 0.1, step)
            self.assertEqual(d["searching"], step < 40, step)
            self.assertLess(d["gain_safe"], 0.75)
            self.assertEqual(d["send"], "dense")  # the safe level's gain is below ε too
        # Every change of what is sent, once: here dense from step 1 on.
        self.assertEqual([t[:3] for t in hook.gravac_trace], [(1, "dense", None)])
        self.assertEqual(len(self.logged), 1)
        self.assertTrue(self.logged[0].startswith("GraVAC from step 1: dense (dense; gain candidate"), self.logged[0])
        self.check_state_follows_parameters(name, 45, sparse_weight=False)

    def test_gravac_ladder_takes_2_bits_backs_off_from_1_and_resumes(self):
        name = "GraVAC uniform 4..1 bits, blocks of 64 + LoCo beta 0.95"
        self.assertEqual(EXT.gravac_ladder_names(), [name])
        m = model()
        hook = self.hook(name, m, print_decisions=True)
        d = hook.ladder.decision
        self.assertEqual((d["candidate_bits"], d["safe_bits"], d["send"]), (4, 4, "safe"))
        # The first step's gain, against an oracle of the quantizer in torch (lm/gravac_gains.py):
        # the energy of g that the 4-bit code of its one block of 53 values keeps.
        _, grads = run_step(hook, m, [[3, 2, 1, 0]], 0)
        g = torch.cat(grads)
        sizes = [x.numel() for x in grads]
        kept = gravac_gains.kept_energy(g, gravac_gains.uniform(g, 4), sizes) / float(g.square().sum())
        self.assertAlmostEqual(hook.ladder.decision["gain_safe"], kept, delta=1e-5)
        seen = [(1, hook.ladder.decision)]
        for step in range(1, 81):
            used = hook.ladder.decision
            run_step(hook, m, [[3, 2, 1, 0]], step)
            seen.append((step + 1, hook.ladder.decision))
            # States only for the widths the step could send.
            self.assertLessEqual(set(hook.widths), {used["candidate_bits"], used["safe_bits"]}, step)
        # Uniform gradients in [-4, 4): 4 bits keep 0.99 of their energy, 2 bits about 0.75, 1 bit
        # none (±4 for every value). Window 1 (steps 0-19) tries 4 bits, window 2 2 bits (sent
        # from its second step, once measured), window 3 1 bit (below ε = 0.4: the safe 4 bits are
        # sent); at its end (step 60) the back-off returns to 2 bits, where the search stops.
        for step, d in seen:
            candidate = 4 if step < 20 else 2 if step < 40 else 1 if step < 60 else 2
            self.assertEqual(d["candidate_bits"], candidate, step)
            self.assertEqual(d["safe_bits"], 4)
            self.assertEqual(d["searching"], step < 60, step)
            fresh = step in (20, 40, 60)  # the new candidate not yet measured
            self.assertEqual(d["send"], "candidate" if candidate == 2 and not fresh else "safe", step)
            self.assertGreater(d["gain_safe"], 0.95)
            if not fresh and candidate == 2:
                self.assertTrue(0.5 < d["gain_candidate"] < 0.95, (step, d))
            if not fresh and candidate == 1:
                self.assertLess(d["gain_candidate"], 0.4)
        self.assertEqual([t[:3] for t in hook.gravac_trace],
                         [(1, "safe", 4), (21, "candidate", 2), (40, "safe", 4), (61, "candidate", 2)])
        self.assertEqual(len(self.logged), 4)
        self.assertTrue(self.logged[1].startswith("GraVAC from step 21: 2-bit (candidate; gain candidate"), self.logged[1])
        self.assertIn(", 2 bits", hook.plans[0])
        self.check_state_follows_parameters(name, 45, sparse_weight=False)
        with self.assertRaises(EXT.GradcompError) as caught:
            hook.ladder.load(hook.ladder.save()[:-1])
        self.assertEqual(caught.exception.args[0], "truncated")

    def test_powersgd_reproduces_and_resumes(self):
        self.assertEqual(EXT.powersgd_names(), ["PowerSGD r=1", "PowerSGD r=2", "PowerSGD r=4",
                                                "PowerSGD r=4, batched"])
        self.check_state_follows_parameters("PowerSGD r=2", 8, sparse_weight=False)
        self.check_state_follows_parameters("PowerSGD r=4, batched", 8, sparse_weight=False)
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 10))  # both weights compressed
        hook = self.hook("PowerSGD r=2", m)
        run_step(hook, m, [[3, 2, 1, 0]], 0)
        saved = hook.powersgd.save()
        self.assertGreater(len(saved), 4 * (128 * 64 + 10 * 128))  # both errors, not the biases' empty states
        with self.assertRaises(EXT.GradcompError) as caught:
            hook.powersgd.load(saved[:-1])
        self.assertEqual(caught.exception.args[0], "truncated")

    def test_powersgd_matches_pytorchs_hook(self):
        # PyTorch's powerSGD_hook on the same bucket, same rank and the same initial Q (gradcomp's
        # draw, put in its memory), with error feedback and warm start, over three steps: the same
        # means up to float32 rounding (both orthonormalise Q and P by Gram-Schmidt; the products
        # and sums differ in order). One rank: the mean is this rank's own rank-2 approximation.
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
        torch.manual_seed(0)
        m = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.Linear(128, 10))
        params = list(m.parameters())
        ours = self.hook("PowerSGD r=2", m)
        theirs = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2,
                                        use_error_feedback=True, warm_start=True)
        theirs.iter = 2  # past PyTorch's warm-up; the hook's starts at 0
        # PyTorch's memory for bucket 0: the Ps, then the Qs of the compressed matrices in bucket order.
        compressed = [0, 2]  # 128 x 64 and 10 x 128; the biases go uncompressed in both
        qs = [EXT.powersgd_initial_q(params[i].shape[1], 2, 0, 0, i) for i in compressed]
        theirs.p_memory_dict[0] = torch.empty(sum(params[i].shape[0] * 2 for i in compressed))
        theirs.q_memory_dict[0] = torch.cat([q.flatten() for q in qs])
        for step in range(3):
            grads = dyadic_gradients(m, step)
            mine = Bucket(0, params, grads, True)
            mean = gradcomp.gradcomp_hook(ours, mine).wait()
            reference = Bucket(0, params, grads, True)
            expected = powersgd.powerSGD_hook(theirs, reference).wait()
            scale = float(expected.abs().max())
            self.assertLess(float((mean - expected).abs().max()), 1e-5 * scale, step)
            self.assertFalse(torch.equal(mean, torch.cat([grads[id(p)].flatten() for p in params])))  # compressed

    def test_typed_constructors_are_the_presets(self):
        # Each preset against the constructor call with its parameters: the same means, step for
        # step over two bucket layouts, and each Codec's spec recorded in the checkpoint.
        pairs = [("top-k 1% + EF", gradcomp.topk(0.01, error_feedback=True)),
                 ("top-k 1% + EF decay 0.9", gradcomp.topk(0.01, error_feedback=True, ef_decay=0.9)),
                 ("top-k 1% + 8-bit values + EF", gradcomp.topk(0.01, error_feedback=True, value_bits=8)),
                 ("random-k 1% + EF", gradcomp.randomk(0.01, seed=7, scaled=False, error_feedback=True)),
                 ("threshold 1% + EF", gradcomp.threshold(0.01, error_feedback=True)),
                 ("uniform 4-bit + LoCo", gradcomp.uniform(4, loco=True)),
                 ("uniform 2-bit + LoCo beta 0.9", gradcomp.uniform(2, loco=True, loco_beta=0.9)),
                 ("uniform 4-bit SR + EF", gradcomp.uniform(4, stochastic=True, seed=3, error_feedback=True)),
                 ("sign + EF", gradcomp.sign()),
                 ("QSGD 7 levels", gradcomp.qsgd(7, seed=5)),
                 ("ZFP R=8", gradcomp.zfp(8)),
                 ("uniform 4-bit shared scale (summed)", gradcomp.shared_scale(4, headroom_bits=3)),
                 ("TAGC f*=0.95 (sharded)", gradcomp.tagc(0.95)),
                 ("TAGC f*=0.95 (sharded), re-sparsified gather", gradcomp.tagc(0.95, resparsify=True)),
                 ("PowerSGD r=4, batched", gradcomp.powersgd(4, batched=True)),
                 ("GraVAC top-k 10%..0.1% + EF, back-off", gradcomp.gravac(0.1, 0.001)),
                 ("GraVAC uniform 4..1 bits, blocks of 64 + LoCo beta 0.95", gradcomp.gravac_bits(4, 1))]
        for preset, codec in pairs:
            with self.subTest(preset=preset):
                m = model()
                by_name, typed = self.hook(preset, m), self.hook(codec, m)
                for step in range(4):
                    layout = [[0, 1, 2, 3]] if step < 2 else [[0, 1], [2, 3]]
                    a, _ = run_step(by_name, m, layout, step)
                    b, _ = run_step(typed, m, layout, step)
                    for i in a:
                        self.assertTrue(torch.equal(a[i], b[i]), f"step {step}, parameter {i}")
                self.assertEqual(typed.state_dict()["codec"], codec.spec)
                resumed = self.hook(codec, m)
                resumed.load_state_dict(typed.state_dict())
                with self.assertRaises(ValueError):
                    by_name.load_state_dict(typed.state_dict())  # another name: refused as another codec
        self.assertEqual(gradcomp.topk(0.01, error_feedback=True), gradcomp.topk(density=0.01, error_feedback=True))
        self.assertEqual(gradcomp.uniform(2, loco=True).spec,
                         "uniform bits=2 block=256 loco=1 loco_beta=0.8 loco_group=256 loco_reset=1024 seed=0 "
                         "stochastic=0")

    def test_dense_constructor_is_the_process_groups_all_reduce(self):
        m = model()
        hook = self.hook(gradcomp.dense(), m)
        means, grads = run_step(hook, m, [[0, 1, 2, 3]], 0)
        self.assertIsNone(hook.codec)
        self.assertEqual(hook.plans, {0: "dense"})
        for i, g in enumerate(grads):
            self.assertTrue(torch.equal(means[i].flatten(), g))

    def test_constructor_arguments_are_checked_and_named(self):
        bad = [(lambda: gradcomp.topk(0), ValueError, "density"),
               (lambda: gradcomp.topk(1.5), ValueError, "density"),
               (lambda: gradcomp.topk("1%"), TypeError, "density"),
               (lambda: gradcomp.topk(0.01, value_bits=4), ValueError, "value_bits"),
               (lambda: gradcomp.topk(0.01, ef_decay=0.9), ValueError, "ef_decay"),
               (lambda: gradcomp.topk(0.01, error_feedback=True, ef_decay=0), ValueError, "ef_decay"),
               (lambda: gradcomp.topk(0.01, error_feedback=1), TypeError, "error_feedback"),
               (lambda: gradcomp.randomk(0.01, seed=-1), ValueError, "seed"),
               (lambda: gradcomp.uniform(bits=3), ValueError, "bits"),
               (lambda: gradcomp.uniform(block=0), ValueError, "block"),
               (lambda: gradcomp.uniform(loco=True, loco_beta=1.0), ValueError, "loco_beta"),
               (lambda: gradcomp.uniform(loco=True, error_feedback=True), ValueError, "loco"),
               (lambda: gradcomp.qsgd(levels=128), ValueError, "levels"),
               (lambda: gradcomp.shared_scale(headroom_bits=25), ValueError, "headroom_bits"),
               (lambda: gradcomp.zfp(2), ValueError, "rate_bits"),
               (lambda: gradcomp.tagc(float("nan")), ValueError, "zero_fraction"),
               (lambda: gradcomp.powersgd(0), ValueError, "rank"),
               (lambda: gradcomp.gravac(0.01, 0.1), ValueError, "theta_max"),
               (lambda: gradcomp.gravac(window=0), ValueError, "window"),
               (lambda: gradcomp.gravac_bits(2, 4), ValueError, "min_bits"),
               (lambda: gradcomp.gravac_bits(3, 1), ValueError, "max_bits")]
        for make, error, argument in bad:
            with self.subTest(argument=argument):
                with self.assertRaises(error) as caught:
                    make()
                self.assertIn(argument, str(caught.exception))
        with self.assertRaises(TypeError):
            self.hook(0.01, model())

    def test_specs_the_extension_refuses_say_why(self):
        # The specs' own checks (python/csrc/codec_spec.hpp), for text that did not come from a constructor.
        for spec, why in [("topk", "needs density"), ("topk density=0.1 loco=1", "no parameter loco"),
                          ("topk density=0.1 density=0.2", "names density twice"),
                          ("uniform bits=3", "bits must be 1, 2, 4 or 8"), ("uniform bits=4 seed=-1", "seed=-1"),
                          ("uniform bits=4 loco=1 error_feedback=1", "both error feedback and LoCo"),
                          ("uniform bits=4 stochastic=2", "not 0 or 1"), ("qsgd levels=nan", "levels=nan"),
                          ("tagc zero_fraction=2", "zero_fraction"), ("lzma level=9", "names no family"),
                          ("top-k 7%", "not key=value")]:
            with self.subTest(spec=spec):
                with self.assertRaises(EXT.GradcompError) as caught:
                    EXT.Codec(spec)
                self.assertEqual(caught.exception.args[0], "invalid_argument")
                self.assertIn(why, caught.exception.args[1])
        with self.assertRaises(EXT.GradcompError) as caught:
            EXT.Codec(gradcomp.tagc().spec)
        self.assertIn("is not a codec", caught.exception.args[1])

    def test_a_gradient_not_in_host_float32_is_copied_with_a_warning(self):
        # No CUDA or 16-bit path yet: such a bucket is copied into float32 host memory, and the first
        # copy in the process says so (a float64 bucket stands for a CUDA or bf16 one here).
        m = model()
        hook = self.hook(gradcomp.topk(1.0), m)  # lossless: on one rank the mean is the input
        params = list(m.parameters())
        grads = {id(p): g.double() for p, g in zip(params, dyadic_gradients(m, 0).values())}
        gradcomp.ddp._staged_to_host.warned = False
        with self.assertWarns(UserWarning) as caught:
            mean = gradcomp.gradcomp_hook(hook, Bucket(0, params, grads, True)).wait()
        self.assertIn("torch.float64 gradients on cpu are copied into float32 host memory", str(caught.warning))
        self.assertEqual(mean.dtype, torch.float64)
        self.assertTrue(torch.equal(mean, torch.cat([g.flatten() for g in grads.values()])))

    def test_foreign_parameter_is_refused(self):
        m = model()
        hook = self.hook("top-k 1% + EF", m)
        stranger = torch.nn.Parameter(torch.zeros(4))
        bucket = Bucket(0, [stranger], {id(stranger): torch.ones(4)}, True)
        with self.assertRaises(KeyError):
            gradcomp.gradcomp_hook(hook, bucket)


# ---- several ranks over Gloo: the hook against gradcomp's scatter_reduce in process -------------

def wide_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.Linear(256, 64))


WIDE_LAYOUT = [[0, 1], [2, 3]]  # buckets of 33024 and 16448 values
STEPS, RESUME_AT = 6, 2
RELAID_LAYOUT = [(("0.weight", "1.bias"), [0, 3]), (("0.bias", "1.weight"), [1, 2])]


def ring_chunk_counts(n, ranks):
    """Chunk j holds ceil(n / P) values for j < n mod P, else floor(n / P) (docs/transports.md §9)."""
    return [n // ranks + (1 if j < n % ranks else 0) for j in range(ranks)]


def frame_bytes(codec, m):
    """A frame of m values as the collectives send it: a 16-byte header and the codec's message
    (of fixed size for the codecs checked here)."""
    x = torch.zeros(m)
    message = codec.encode(x, codec.make_state(m)) if codec.stateful else codec.encode(x)
    return 16 + message.numel()


def plan_bytes(frame, n, ranks, rank):
    """What rank `rank` sends under gather_decode and under scatter_reduce when a frame of m values
    takes frame(m) bytes (docs/transports.md §9)."""
    counts = ring_chunk_counts(n, ranks)
    gather = (ranks - 1) * frame(n)
    scatter = sum(frame(counts[j]) for j in range(ranks) if j != rank) + (ranks - 1) * frame(counts[rank])
    return gather, scatter


def _hook_worker(rank, world, port, codecs, out):
    """One rank: each codec through the hook for STEPS steps of WIDE_LAYOUT (gradients of this
    rank), its means, plans, sent bytes and saved bucket states per step; then a fresh hook resumed
    from the state_dict taken after step RESUME_AT, re-running the later steps."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    results = {}
    for name in codecs:
        m = wide_model()
        hook = gradcomp.GradcompHookState(name, m, extension=EXT, log=lambda *_: None)
        runs = {"plans": [], "sent": [], "wire": [], "seconds": [], "means": [], "states": [], "resumed_means": [],
                "resumed_states": []}
        saved = None
        for step in range(STEPS):
            start = time.perf_counter()
            means, _ = run_step(hook, m, WIDE_LAYOUT, step, rank)
            runs["seconds"].append((hook.codec_seconds, hook.wire_seconds, time.perf_counter() - start))
            runs["means"].append(means)
            runs["plans"].append(dict(hook.plans))
            runs["sent"].append(hook.sent_bytes)
            runs["wire"].append(hook.wire_bytes)
            runs["states"].append({k: hook.codec.save_bucket_state(s) for k, (s, _) in hook.states.items()})
            if step == RESUME_AT:
                saved = hook.state_dict()
        resumed = gradcomp.GradcompHookState(name, m, extension=EXT, log=lambda *_: None)
        resumed.load_state_dict(saved)
        for step in range(RESUME_AT + 1, STEPS):
            means, _ = run_step(resumed, m, WIDE_LAYOUT, step, rank)
            runs["resumed_means"].append(means)
            runs["resumed_states"].append({k: resumed.codec.save_bucket_state(s) for k, (s, _) in resumed.states.items()})
        # DDP rebuilds the buckets: the states are re-laid into the parameters' new buckets.
        runs["before_relay"] = errors_by_parameter(hook)
        params = list(m.parameters())
        for key, positions in RELAID_LAYOUT:
            hook._state_for(key, [params[i].numel() for i in positions])
        runs["after_relay"] = errors_by_parameter(hook)
        runs["dropped"] = hook.server_values_dropped
        results[name] = runs
    torch.save(results, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


def same_bits(a, b):
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int32), b.contiguous().view(torch.int32))


class ScatterReduceHookTest(unittest.TestCase):
    """The hook over Gloo at P = 2, 3, 4 against gradcomp's scatter_reduce called directly over the
    in-process transport (Codec.in_process_scatter_reduce) on the same gradients."""

    port = 29700

    def run_ranks(self, world, codecs):
        ScatterReduceHookTest.port += 7
        with tempfile.TemporaryDirectory() as out:
            torch.multiprocessing.spawn(_hook_worker, args=(world, ScatterReduceHookTest.port, codecs, out), nprocs=world)
            return [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(world)]

    def check(self, world, codecs):
        ranks = self.run_ranks(world, codecs)
        m = wide_model()
        params = list(m.parameters())
        sent = {}
        for name in codecs:
            codec = EXT.Codec(name)
            runs = [r[name] for r in ranks]
            sizes = [sum(params[i].numel() for i in positions) for positions in WIDE_LAYOUT]
            # The plan: scatter_reduce exactly where the cost model (frames of the codec's
            # modelled_encoded_bytes) says rank 0, which sends the most, sends fewer bytes than
            # under gather_decode; and each rank sends what its plan's real messages take.
            model_frame = lambda m: 16 + codec.modelled_encoded_bytes(m)  # noqa: E731
            wire = [0] * world
            for r in range(world):
                expected = 0
                for index, n in enumerate(sizes):
                    gather, scatter = plan_bytes(lambda m: frame_bytes(codec, m), n, world, r)
                    model = plan_bytes(model_frame, n, world, 0)
                    wanted = "scatter_reduce" if model[1] < model[0] else "gather_decode"
                    self.assertEqual(runs[r]["plans"][0][index], wanted, (name, world, n))
                    expected += scatter if wanted == "scatter_reduce" else gather
                    # On the wire, per rank: the 40-byte agreement record all-gathered, every
                    # gather after an all-reduce of the P sizes (int64, a ring: 2(P - 1)/P of 8P
                    # bytes) and padded to the longest block, an all-to-all after one of the sizes;
                    # scatter_reduce also agrees on the owners' status (a MAX of one double) before
                    # its gather.
                    sizes_reduce = 2 * (world - 1) * 8 * world // world
                    wire[r] += sizes_reduce + (world - 1) * 40
                    if wanted == "scatter_reduce":
                        chunks = [frame_bytes(codec, c) for c in ring_chunk_counts(n, world)]
                        wire[r] += 8 * (world - 1) + sum(chunks) - chunks[r]
                        wire[r] += 2 * (world - 1) * 8 // world
                        wire[r] += sizes_reduce + (world - 1) * max(chunks)
                    else:
                        wire[r] += sizes_reduce + (world - 1) * frame_bytes(codec, n)
                self.assertEqual(runs[r]["sent"], [expected] * STEPS, (name, world, r))
                self.assertEqual(runs[r]["wire"], [wire[r]] * STEPS, (name, world, r))
                # The step's time in the codec and in the process group: both spent, within the step's.
                for codec_seconds, wire_seconds, step_seconds in runs[r]["seconds"]:
                    self.assertGreater(codec_seconds, 0.0, (name, world, r))
                    self.assertGreater(wire_seconds, 0.0, (name, world, r))
                    self.assertLess(codec_seconds + wire_seconds, step_seconds, (name, world, r))
            sent[name] = runs[0]["sent"][0]
            # The means and states against the library's scatter_reduce in process, bucket by bucket.
            references = {}
            compared = 0
            for step in range(STEPS):
                grads = [dyadic_gradients(m, step, r) for r in range(world)]
                for index, positions in enumerate(WIDE_LAYOUT):
                    if runs[0]["plans"][step][index] != "scatter_reduce":
                        continue
                    data = [torch.cat([grads[r][id(params[i])].flatten() for i in positions]) for r in range(world)]
                    n = data[0].numel()
                    states = references.setdefault(index, [codec.make_bucket_state(n, world, r) for r in range(world)])
                    codec.in_process_scatter_reduce(data, states, step=step, tensor_id=index)
                    key = tuple(f"{i // 2}.{'weight' if i % 2 == 0 else 'bias'}" for i in positions)
                    for r in range(world):
                        hooked = torch.cat([runs[r]["means"][step][i] for i in positions])
                        self.assertTrue(same_bits(hooked, data[r]), (name, world, step, index, r))
                        self.assertEqual(runs[r]["states"][step][key], codec.save_bucket_state(states[r]),
                                         (name, world, step, index, r))
                    compared += 1
            if world > 2:  # at P = 2 two chunk frames never undercut one whole frame
                self.assertEqual(compared, STEPS * len(WIDE_LAYOUT), (name, world))
            # Resumed from the checkpoint: the same bits.
            for r in range(world):
                for k, step in enumerate(range(RESUME_AT + 1, STEPS)):
                    for i, mean in runs[r]["means"][step].items():
                        self.assertTrue(same_bits(runs[r]["resumed_means"][k][i], mean), (name, world, r, step, i))
                    self.assertEqual(runs[r]["resumed_states"][k], runs[r]["states"][step], (name, world, r, step))
            if world > 2 and "LoCo" not in name:  # LoCo stores its error in 8 bits: not exact
                self.check_relaid(world, codec, runs)
        return sent

    def check_relaid(self, world, codec, runs):
        """Re-laid states carry the worker errors exactly and the server error of each rank's new
        chunk; a stateful codec folds the rest of the server error into the worker error (the sum
        over the ranks of everything carried is unchanged: exact here, every value a multiple of
        1/64), a stateless one drops it and counts it."""
        params = dict(wide_model().named_parameters())
        if codec.stateful:
            for name in params:
                total = [sum(w + s for w, s in (r[key][name] for r in runs)) for key in ("before_relay", "after_relay")]
                self.assertTrue(torch.equal(total[0], total[1]), name)
            self.assertEqual([r["dropped"] for r in runs], [0] * world)
            return
        for rank, r in enumerate(runs):
            dropped = 0
            for key, positions in RELAID_LAYOUT:
                before = torch.cat([r["before_relay"][name][1] for name in key])
                after = torch.cat([r["after_relay"][name][1] for name in key])
                counts = ring_chunk_counts(before.numel(), world)
                own = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
                kept = torch.zeros_like(before)
                kept[own] = before[own]
                self.assertTrue(torch.equal(after, kept), (key, rank))
                dropped += int((before - kept).count_nonzero())
            self.assertGreater(dropped, 0)
            self.assertEqual(r["dropped"], dropped, rank)

    def test_two_ranks(self):
        self.check(2, ["uniform 4-bit", "uniform 4-bit + LoCo"])

    def test_three_and_four_ranks_send_flat_bytes(self):
        codecs = ["top-k 1% + EF", "uniform 4-bit", "uniform 4-bit + LoCo"]
        three = self.check(3, codecs)
        four = self.check(4, codecs)
        params = list(wide_model().parameters())
        sizes = [sum(params[i].numel() for i in positions) for positions in WIDE_LAYOUT]
        for name in codecs:
            # scatter_reduce: about 2 (P - 1) / P of one message per bucket, whatever P, where
            # gather_decode sends P - 1 messages (two at P = 3, three at P = 4).
            one_message = sum(frame_bytes(EXT.Codec(name), n) for n in sizes)
            self.assertLess(three[name], 2 * one_message, name)
            self.assertLess(four[name], 2 * one_message, name)
            self.assertLess(four[name], three[name] * 5 / 4, name)
            print(f"{name}: bytes per step P=3 {three[name]}, P=4 {four[name]}, one message {one_message}")


def _tagc_worker(rank, world, port, out):
    """One rank: TAGC at f* = 0.95 with the lossless and the re-sparsified gather, side by side on the
    same gradients of WIDE_LAYOUT for STEPS steps; each step's means and the owner's residuals."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    m = wide_model()
    hooks = [gradcomp.GradcompHookState(name, m, extension=EXT, log=lambda *_: None)
             for name in ("TAGC f*=0.95 (sharded)", "TAGC f*=0.95 (sharded), re-sparsified gather")]
    runs = {"lossless": [], "resparsified": [], "residuals": []}
    for step in range(STEPS):
        runs["lossless"].append(run_step(hooks[0], m, WIDE_LAYOUT, step, rank)[0])
        runs["resparsified"].append(run_step(hooks[1], m, WIDE_LAYOUT, step, rank)[0])
        runs["residuals"].append({k: v.clone() for k, v in hooks[1].tagc.owner_residuals(hooks[1].tagc_state).items()})
    torch.save(runs, os.path.join(out, f"rank{rank}.pt"))
    dist.destroy_process_group()


class TagcGatherTest(unittest.TestCase):
    """TAGC's re-sparsified gather over Gloo at P = 3: every rank ends with the same bits; each owner
    sends the ⌈5%⌉ largest values of its shard of the mean (the lossless row's, whose TAGC states
    follow the same gradients) plus its residual, exactly, and keeps the rest."""

    def test_owners_resparsify_and_keep_the_rest(self):
        world = 3
        with tempfile.TemporaryDirectory() as out:
            torch.multiprocessing.spawn(_tagc_worker, args=(world, 29690, out), nprocs=world)
            runs = [torch.load(os.path.join(out, f"rank{r}.pt")) for r in range(world)]
        params = list(wide_model().parameters())
        for bucket, (weight, bias) in enumerate(WIDE_LAYOUT):  # the weight compressed, the bias dense
            n = params[weight].numel()
            ms = -(-n // world)  # the sparse part padded with zeros to P equal shards
            residual = [torch.zeros(ms) for _ in range(world)]
            for step in range(STEPS):
                for r in range(world):
                    for i in (weight, bias):
                        self.assertTrue(same_bits(runs[r]["resparsified"][step][i], runs[0]["resparsified"][step][i]))
                    self.assertTrue(torch.equal(runs[r]["resparsified"][step][bias], runs[r]["lossless"][step][bias]))
                padded = lambda v: torch.cat([v, torch.zeros(world * ms - n)])  # noqa: E731
                mean = padded(runs[0]["lossless"][step][weight])
                sent = padded(runs[0]["resparsified"][step][weight])
                for r in range(world):
                    a = mean[r * ms:(r + 1) * ms] + residual[r]
                    s = sent[r * ms:(r + 1) * ms]
                    kept = s != 0
                    self.assertEqual(int(kept.sum()), ms - math.floor(0.95 * ms), (bucket, step, r))
                    self.assertTrue(torch.equal(s[kept], a[kept]))
                    self.assertGreaterEqual(a[kept].abs().min().item(), a[~kept].abs().max().item())
                    residual[r] = a - s
                    (carried,) = [v for v in runs[r]["residuals"][step].values() if v.numel() == ms]
                    self.assertTrue(torch.equal(carried, residual[r]), (bucket, step, r))


if __name__ == "__main__":
    unittest.main()
