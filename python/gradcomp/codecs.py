"""Typed codec constructors: what GradcompHookState compresses with.

    gradcomp.topk(density=0.01, error_feedback=True)
    gradcomp.uniform(bits=4, loco=True)
    gradcomp.tagc(zero_fraction=0.95)

Each returns a `Codec`, checked here (a bad argument raises ValueError or TypeError naming it) and
again by the C++ codec when the hook builds it. A Codec's `spec` is its text form
(python/csrc/codec_spec.hpp: "family key=value ..."), which the hook's checkpoints record and the
extension parses; two Codecs with the same arguments have the same spec.
"""

import math
import numbers

__all__ = ["Codec", "dense", "topk", "randomk", "threshold", "uniform", "qsgd", "sign", "shared_scale", "zfp",
           "tagc", "powersgd", "gravac", "gravac_bits"]


class Codec:
    """A codec (or a scheme: TAGC, PowerSGD, GraVAC) and its parameters, for GradcompHookState.

    kind: "dense", "codec" (one codec per bucket), "tagc", "powersgd", "gravac" or "gravac_bits".
    spec: the text the extension parses (python/csrc/codec_spec.hpp).
    """

    __slots__ = ("kind", "family", "params", "spec")

    def __init__(self, kind, family, params):
        self.kind = kind
        self.family = family
        self.params = dict(params)
        self.spec = " ".join([family] + [f"{k}={_text(v)}" for k, v in sorted(self.params.items())])

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.params.items()))
        return f"gradcomp.{self.family}({args})"

    def __eq__(self, other):
        return isinstance(other, Codec) and other.spec == self.spec

    def __hash__(self):
        return hash(self.spec)


def _text(value):
    if isinstance(value, bool):
        return "1" if value else "0"
    return repr(value)


def _real(name, value, low, high, low_open=False, high_open=False):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r}")
    value = float(value)
    below = value <= low if low_open else value < low
    above = value >= high if high_open else value > high
    if not math.isfinite(value) or below or above:
        raise ValueError(f"{name} must lie in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}, "
                         f"got {value!r}")
    return value


def _whole(name, value, low, high=2**32 - 1, allowed=None):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if allowed is not None and value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value}")
    if not low <= value <= high:
        raise ValueError(f"{name} must lie in [{low}, {high}], got {value}")
    return value


def _flag(name, value):
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def _seed(value):
    return _whole("seed", value, 0, 2**64 - 1)


def _feedback(params, error_feedback, ef_decay, loco=None, loco_beta=None, loco_group=None, loco_reset=None):
    """Adds the optional wrappers' parameters: error feedback (with its decay) or LoCo."""
    if _flag("error_feedback", error_feedback):
        params["error_feedback"] = True
        decay = _real("ef_decay", ef_decay, 0.0, 1.0, low_open=True)
        if decay != 1.0:
            params["ef_decay"] = decay
    elif ef_decay != 1.0:
        raise ValueError("ef_decay needs error_feedback=True")
    if loco is not None and _flag("loco", loco):
        if error_feedback:
            raise ValueError("loco and error_feedback exclude each other: LoCo is error feedback")
        params["loco"] = True
        params["loco_beta"] = _real("loco_beta", loco_beta, 0.0, 1.0, high_open=True)
        params["loco_group"] = _whole("loco_group", loco_group, 1)
        params["loco_reset"] = _whole("loco_reset", loco_reset, 1)
    return params


def dense():
    """No compression: DDP's own all-reduce of each bucket."""
    return Codec("dense", "dense", {})


def topk(density, *, error_feedback=False, ef_decay=1.0, value_bits=None):
    """Top-k: the ceil(density·n) values of largest magnitude of each bucket, with their indices.

    density: fraction kept, in (0, 1]. error_feedback: keep what is not sent and add it to the next
    step's gradient, decayed by ef_decay in (0, 1] (docs/feedback.md §7: 0.9 suits Adam).
    value_bits: None sends the kept values as float32; 8 sends them in 8-bit uniform codes.
    """
    params = {"density": _real("density", density, 0.0, 1.0, low_open=True)}
    if value_bits is not None:
        params["value_bits"] = _whole("value_bits", value_bits, 8, 8, allowed=(8,))
    return Codec("codec", "topk", _feedback(params, error_feedback, ef_decay))


def randomk(density, *, seed=0, scaled=True, error_feedback=False, ef_decay=1.0):
    """Random-k: ceil(density·n) positions drawn from `seed` (the same on every rank), their values
    sent; decoded as value·n/k when `scaled` (unbiased), else as the value (better under EF)."""
    params = {"density": _real("density", density, 0.0, 1.0, low_open=True), "seed": _seed(seed),
              "scaled": _flag("scaled", scaled)}
    return Codec("codec", "randomk", _feedback(params, error_feedback, ef_decay))


def threshold(density, *, seed=0, error_feedback=False, ef_decay=1.0):
    """Threshold sparsification: the values above a threshold estimated from a sample to keep about
    density·n of them (no full selection)."""
    params = {"density": _real("density", density, 0.0, 1.0, low_open=True), "seed": _seed(seed)}
    return Codec("codec", "threshold", _feedback(params, error_feedback, ef_decay))


def uniform(bits=4, *, block=256, stochastic=False, seed=0, error_feedback=False, ef_decay=1.0, loco=False,
            loco_beta=0.8, loco_group=256, loco_reset=1024):
    """Uniform quantization: `bits`-bit codes (1, 2, 4 or 8) with a float32 scale per `block`
    values, rounded to nearest (or stochastically, keyed by `seed`). loco: LoCo's error feedback
    (error averaged with weight loco_beta, stored in 8 bits per loco_group values, reset every
    loco_reset steps); or plain error_feedback."""
    params = {"bits": _whole("bits", bits, 1, 8, allowed=(1, 2, 4, 8)), "block": _whole("block", block, 1),
              "stochastic": _flag("stochastic", stochastic), "seed": _seed(seed)}
    return Codec("codec", "uniform",
                 _feedback(params, error_feedback, ef_decay, loco, loco_beta, loco_group, loco_reset))


def qsgd(levels=15, *, bucket=256, seed=0, error_feedback=False, ef_decay=1.0, loco=False, loco_beta=0.8,
         loco_group=256, loco_reset=1024):
    """QSGD: |x|/‖x‖ stochastically rounded to `levels` levels (1 to 127) per `bucket` values."""
    params = {"levels": _whole("levels", levels, 1, 127), "bucket": _whole("bucket", bucket, 1), "seed": _seed(seed)}
    return Codec("codec", "qsgd", _feedback(params, error_feedback, ef_decay, loco, loco_beta, loco_group, loco_reset))


def sign(*, block=256, error_feedback=True, ef_decay=1.0, loco=False, loco_beta=0.8, loco_group=256,
         loco_reset=1024):
    """Sign quantization: one bit per value and the mean magnitude per `block` values; with error
    feedback by default (signSGD without it loses what the signs drop)."""
    params = {"block": _whole("block", block, 1)}
    if loco:
        error_feedback = False
    return Codec("codec", "sign", _feedback(params, error_feedback, ef_decay, loco, loco_beta, loco_group, loco_reset))


def shared_scale(bits=4, *, block=256, headroom_bits=3):
    """Homomorphic uniform quantization: block maxima agreed by a MAX all-reduce, then codes in
    fields of bits + headroom_bits bits that the ranks sum with one integer all-reduce (up to
    2^headroom_bits ranks)."""
    params = {"bits": _whole("bits", bits, 1, 8, allowed=(1, 2, 4, 8)), "block": _whole("block", block, 1),
              "headroom_bits": _whole("headroom_bits", headroom_bits, 0, 24)}
    return Codec("codec", "shared_scale", params)


def zfp(rate_bits=8):
    """ZFP fixed rate: `rate_bits` bits per value (3 to 32), the hybrid scheme's float codec."""
    return Codec("codec", "zfp", {"rate_bits": _whole("rate_bits", rate_bits, 3, 32)})


def tagc(zero_fraction=0.95, *, block=128, resparsify=False):
    """TAGC (sharded): dynamic sparsification to `zero_fraction` zeros with error feedback, LHC's
    index all-reduce and sketch reduce-scatter (`block` values per sketch block), one collective
    sequence per bucket; the shards of the mean are then all-gathered losslessly, or, with
    `resparsify`, each owner re-sparsifies its shard to the same fraction with its own residual
    (less traffic at large P; docs/pytorch.md §2)."""
    params = {"zero_fraction": _real("zero_fraction", zero_fraction, 0.0, 1.0), "block": _whole("block", block, 1),
              "resparsify": _flag("resparsify", resparsify)}
    return Codec("tagc", "tagc", params)


def powersgd(rank=4, *, batched=False):
    """PowerSGD: every parameter as a matrix (first dimension by the rest) of rank `rank`, warm
    started, with PyTorch's error feedback; `batched`: each bucket as one square matrix, as
    PyTorch's batched_powerSGD_hook."""
    return Codec("powersgd", "powersgd", {"rank": _whole("rank", rank, 1), "batched": _flag("batched", batched)})


def gravac(theta_min=0.1, theta_max=0.001, *, epsilon=0.75, window=20, back_off=True):
    """GraVAC: top-k with error feedback whose density one controller chooses for the model, searching
    from theta_min down to theta_max (halving each `window` steps) while the compressed gradient
    keeps at least `epsilon` of the gradient's norm; `back_off` raises the density again when it
    does not (docs/control.md §1.1)."""
    theta_min = _real("theta_min", theta_min, 0.0, 1.0, low_open=True)
    theta_max = _real("theta_max", theta_max, 0.0, 1.0, low_open=True)
    if theta_max > theta_min:
        raise ValueError(f"theta_max must not exceed theta_min, got {theta_max!r} > {theta_min!r}")
    params = {"theta_min": theta_min, "theta_max": theta_max, "epsilon": _real("epsilon", epsilon, 0.0, math.inf),
              "window": _whole("window", window, 1), "back_off": _flag("back_off", back_off)}
    return Codec("gravac", "gravac", params)


def gravac_bits(max_bits=4, min_bits=1, *, epsilon=0.4, window=20, back_off=True, block=64, loco_beta=0.95):
    """GraVAC over quantizer widths: one controller chooses the bit width (max_bits down to
    min_bits, each of 1, 2, 4, 8) for the model, each width sent by uniform codes with a scale per
    `block` values and LoCo at loco_beta (docs/control.md §1.8)."""
    max_bits = _whole("max_bits", max_bits, 1, 8, allowed=(1, 2, 4, 8))
    min_bits = _whole("min_bits", min_bits, 1, 8, allowed=(1, 2, 4, 8))
    if min_bits >= max_bits:
        raise ValueError(f"min_bits must be below max_bits, got {min_bits} and {max_bits}")
    params = {"max_bits": max_bits, "min_bits": min_bits, "epsilon": _real("epsilon", epsilon, 0.0, math.inf),
              "window": _whole("window", window, 1), "back_off": _flag("back_off", back_off),
              "block": _whole("block", block, 1), "loco_beta": _real("loco_beta", loco_beta, 0.0, 1.0, high_open=True)}
    return Codec("gravac_bits", "gravac_bits", params)
