#!/usr/bin/env bash
# Usage: check_torch.sh PYTHON [BUILD]
# The PyTorch package against the torch of PYTHON's environment (a venv with torch from PyPI, or
# Debian's python3 through a venv made with --system-site-packages): installs the package there
# (`pip install --no-build-isolation`, setuptools' folders in BUILD, default a temporary one),
# then runs the unittest cases (the DDP hook's, and the FSDP hook's where FSDP runs on the CPU),
# the README's example and two-rank training over gloo with dense,
# top-k + EF, 4-bit LoCo and TAGC within 5% of dense, resumed from a checkpoint bit for bit.
# ctest's `pytorch` label runs the same against Debian's torch in CI; docs/pytorch.md §6 has what
# this printed for torch from PyPI.
set -euo pipefail
python=$1
build=${2:-$(mktemp -d)}
here=$(cd "$(dirname "$0")" && pwd)
start=$SECONDS
"$python" -c 'import sys, torch; print(f"python {sys.version.split()[0]}, torch {torch.__version__}")'
GRADCOMP_PYTHON_BUILD_DIR="$build" "$python" -m pip install --no-build-isolation --no-deps --disable-pip-version-check \
  -q "$here/../../python"
echo "installed in $((SECONDS - start)) s"
cd "$here"
export OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
"$python" -m unittest test_gradcomp_ddp 2>&1 | tail -3
"$python" -m unittest -v test_fsdp 2>&1 | grep -E '^P =|skipped|^OK|FAILED|Error' | tail -4
"$python" readme_example.py
"$python" train_ddp.py --world 2 --steps 200 --max-loss-gap 5 --resume-at 77 --port 29890 --watchdog 300 \
  --codec dense --codec "top-k 1% + EF" --codec "uniform 4-bit + LoCo" --codec "TAGC f*=0.95 (sharded)" | tail -8
echo "check_torch.sh: passed in $((SECONDS - start)) s"
