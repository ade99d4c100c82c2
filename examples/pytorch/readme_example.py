"""Runs the README's PyTorch example (the ```python block between the readme-python markers) as a
user would paste it: on one gloo rank, with `model` a small linear model, then trains three steps
through the hook it registers and checks that the hook ran them and that the parameters moved."""

import os
import re
import sys
import tempfile

import torch
import torch.distributed as dist


def main():
    readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "README.md")
    with open(readme) as f:
        text = f.read()
    found = re.search(r"<!-- readme-python-begin -->\s*```python\n(.*?)```\s*<!-- readme-python-end -->", text, re.S)
    if not found:
        print("README.md has no ```python block between the readme-python markers")
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        dist.init_process_group("gloo", init_method="file://" + os.path.join(tmp, "rendezvous"), rank=0,
                                world_size=1)
        torch.manual_seed(0)
        scope = {"model": torch.nn.Linear(64, 8)}
        exec(compile(found.group(1), "README.md", "exec"), scope)
        ddp, hook, model = scope["ddp"], scope["hook"], scope["model"]
        before = [p.detach().clone() for p in model.parameters()]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            optimizer.zero_grad()
            ddp(torch.randn(16, 64)).square().mean().backward()
            if not hook.step_skipped:
                optimizer.step()
        dist.destroy_process_group()
    moved = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    print(f"README example: {hook.step} hook steps, plans {hook.plans}, parameters moved: {moved}")
    return 0 if hook.step == 3 and hook.plans and moved else 1


if __name__ == "__main__":
    sys.exit(main())
