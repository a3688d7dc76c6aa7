#!/usr/bin/env bash
# A venv with pytest-torch, the closest peer, for `python benchmarks/audit_overhead.py --peer .peer/bin/python`.
# It registers a pytest plugin, so it lives apart from maskcheck's own environment. Same torch and
# transformers as ours (the CPU build of torch first, so pip does not pull a CUDA build).
set -euo pipefail
venv="${1:-.peer}"
python3 -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0
transformers_version="$(.venv/bin/python -c 'import transformers; print(transformers.__version__)' 2>/dev/null || echo 5.24.0)"
"$venv/bin/pip" install -q pytest-torch==1.1.1 "transformers==$transformers_version"
echo "peer venv: $venv (pytest-torch 1.1.1, transformers $transformers_version)"
