#!/usr/bin/env bash
# Usage: install_package.sh PYTHON VENV PACKAGE BUILD
# Installs the gradcomp package as docs/pytorch.md §1 says: a fresh venv VENV made by PYTHON that
# sees PYTHON's site packages (there: the system's torch), then `pip install --no-build-isolation`
# of PACKAGE (the repository's python/), offline, with setuptools' build folders in BUILD. Then
# imports the installed package from outside the checkout and prints where it is, how many codec
# names it has and how long the install took.
set -euo pipefail
python=$1 venv=$2 package=$3 build=$4
start=$SECONDS
rm -rf "$venv" "$build"
"$python" -m venv --system-site-packages "$venv"
GRADCOMP_PYTHON_BUILD_DIR="$build" "$venv/bin/python" -m pip install --no-build-isolation --no-deps --no-index \
  --disable-pip-version-check "$package"
cd /
"$venv/bin/python" - "$venv" <<'PY'
import os, sys
import gradcomp
where = os.path.realpath(gradcomp.__file__)
assert where.startswith(os.path.realpath(sys.argv[1])), f"gradcomp imported from {where}, not from the venv"
print(f"gradcomp from {where}: {len(gradcomp.codec_names())} codec names")
PY
echo "installed in $((SECONDS - start)) s"
