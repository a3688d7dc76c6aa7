#!/usr/bin/env bash
# Create .venv and install maskcheck with its test dependencies (the extras in
# MASKCHECK_EXTRAS, default "dev"; VENV names another environment: .ci/run builds
# .venv-torchtune with "dev,torchtune" this way).
#
# torch: an importable torch (in the Python that runs this script) is kept: the venv
# then sees it through --system-site-packages. Only when there is none is torch==2.13.0
# installed, from PyTorch's CPU index on a machine without an NVIDIA driver, so a CPU
# machine never downloads the multi-GB CUDA build. Bring your own torch by installing
# it first (CPU or CUDA), or set MASKCHECK_TORCH_SPEC / MASKCHECK_TORCH_INDEX.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
VENV="${VENV:-.venv}"
TORCH_SPEC="${MASKCHECK_TORCH_SPEC:-torch==2.13.0}"
EXTRAS="${MASKCHECK_EXTRAS:-dev}"

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "setup: keeping the installed torch $("$PYTHON" -c 'import torch; print(torch.__version__)')"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi

if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  index_args=()
  if [ -n "${MASKCHECK_TORCH_INDEX:-}" ]; then
    index_args=(--extra-index-url "$MASKCHECK_TORCH_INDEX")
  elif ! command -v nvidia-smi >/dev/null 2>&1; then
    index_args=(--extra-index-url https://download.pytorch.org/whl/cpu)  # the CPU build, never CUDA
  fi
  echo "setup: installing $TORCH_SPEC"
  "$VENV/bin/pip" install --quiet --retries 0 --timeout 10 "${index_args[@]}" "$TORCH_SPEC"
fi

"$VENV/bin/pip" install --quiet -e ".[$EXTRAS]"
echo "setup: ready ($("$VENV/bin/python" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'))"
