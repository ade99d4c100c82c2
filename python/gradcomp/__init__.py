"""gradcomp for PyTorch: gradient compression as a DistributedDataParallel communication hook.

    import gradcomp
    hook = gradcomp.GradcompHookState(gradcomp.uniform(bits=4, loco=True), model)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp.register_comm_hook(hook, gradcomp.gradcomp_hook)

FSDP (FSDP1's register_comm_hook): `gradcomp.FSDPHookState(codec, fsdp_model)` and
`gradcomp.fsdp_hook` (fsdp.py). The codecs come from typed constructors (codecs.py: topk, randomk, threshold, uniform, qsgd, sign,
shared_scale, zfp, tagc, powersgd, gravac, gravac_bits, dense); `codec_names()` lists the presets
the docs' measurements name. docs/pytorch.md is the guide. The C++ extension
(gradcomp._gradcomp_torch) is compiled against this environment's torch when the package is
installed: `python3 -m pip install --no-build-isolation ./python` from a gradcomp checkout.
"""

from .codecs import (Codec, dense, gravac, gravac_bits, powersgd, qsgd, randomk, shared_scale, sign, tagc, threshold,
                     topk, uniform, zfp)
from .ddp import DENSE, GradcompHookState, ProcessGroupOps, extension, gradcomp_hook
from .fsdp import FSDPHookState, fsdp_hook

GradcompError = extension().GradcompError


def codec_names():
    """The presets GradcompHookState also takes by name (the rows of the docs' tables): "dense",
    the codecs, then the TAGC, GraVAC and PowerSGD rows (each scheme's rows sorted)."""
    ext = extension()
    return ([DENSE] + ext.codec_names() + ext.tagc_names() + ext.gravac_names() + ext.gravac_ladder_names() +
            ext.powersgd_names())


def refused_rows():
    """The training table's rows the hook cannot run, by name: why (GradcompHookState raises
    GradcompError for them)."""
    return extension().refused_rows()


__all__ = ["DENSE", "Codec", "FSDPHookState", "GradcompError", "GradcompHookState", "ProcessGroupOps", "codec_names", "dense",
           "extension", "fsdp_hook", "gradcomp_hook", "gravac", "gravac_bits", "powersgd", "qsgd", "randomk", "refused_rows",
           "shared_scale", "sign", "tagc", "threshold", "topk", "uniform", "zfp"]
