"""The byte-level corpus of the LM task (docs/lm-task.md §1): Python 3.11's standard library.

The corpus is the concatenation, in sorted file-name order, of every `*.py` file directly in
/usr/lib/python3.11 (Debian 12's libpython3.11-stdlib 3.11.2-6+deb12u6: 171 files, 4,742,373
bytes; subdirectories are not included). The first 90% of the bytes train, the last 10% validate.
`corpus_digest` lets a run record which corpus it saw.
"""

import glob
import hashlib
import os

import torch

STDLIB = "/usr/lib/python3.11"
VALIDATION_FRACTION = 0.1


def load_corpus(root=STDLIB):
    """(train, validation) as uint8 tensors, and the SHA-256 of the whole corpus."""
    paths = sorted(glob.glob(os.path.join(root, "*.py")))
    if not paths:
        raise FileNotFoundError(f"no *.py files in {root}")
    data = b"".join(open(p, "rb").read() for p in paths)
    digest = hashlib.sha256(data).hexdigest()
    split = int(len(data) * (1.0 - VALIDATION_FRACTION))
    tensor = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return tensor[:split].clone(), tensor[split:].clone(), digest


def train_batch(train, seed, step, rank, batch, context):
    """Rank `rank`'s minibatch of step `step`: `batch` random windows of context + 1 bytes, a
    function of the arguments only (inputs, targets as int64)."""
    g = torch.Generator().manual_seed(((seed * 1_000_003 + step) * 1_009 + rank) & 0x7FFF_FFFF_FFFF_FFFF)
    starts = torch.randint(0, len(train) - context - 1, (batch,), generator=g)
    windows = torch.stack([train[s : s + context + 1] for s in starts.tolist()]).long()
    return windows[:, :-1], windows[:, 1:]


def validation_batches(validation, context, windows, batch):
    """The fixed validation set: the first `windows` non-overlapping windows of the validation
    bytes, in batches of `batch`."""
    usable = min(windows, (len(validation) - 1) // context)
    starts = [i * context for i in range(usable)]
    out = []
    for b in range(0, usable, batch):
        w = torch.stack([validation[s : s + context + 1] for s in starts[b : b + batch]]).long()
        out.append((w[:, :-1], w[:, 1:]))
    return out
