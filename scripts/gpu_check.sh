#!/usr/bin/env bash
# The one prepared GPU run (issue #7), for a machine with CUDA, from the repository root:
#
#   bash scripts/gpu_check.sh        # logs and JSON reports into $OUT, else ./gpu-results
#
# 1. the noise floors in float32, bfloat16 and float16 measured on the GPU: the evidence
#    for the CUDA rows of the tolerance table (harness/engine/tolerance.py);
# 2. the overhead benchmark of both models in bfloat16 (the dtype people deploy) and
#    float32, timed with a synchronize after every forward;
# 3. the ci-profile audit of the tiny reference model and of the GPT-2-small shape in
#    bfloat16 and float16, as JSON reports, and the quick profile's audit of the latter;
# 4. maskcheck compare of the GPT-2-small shape's eager and sdpa backends in bfloat16 and
#    float16 (the kernel swap people make on a GPU), as JSON;
# 5. whether CUDA's softmax of bfloat16 and float16 scores is the float32 softmax cast back
#    (scripts/softmax_input_dtype.py; docs/compare.md).
#
# It uses the machine's own python3 (PYTHON overrides it) with torch, transformers,
# hypothesis, safetensors and matplotlib, as the lent H200 image has them; about five
# minutes on an H200 by estimate. Not `set -e`: a failing step is logged, the others run.
set -uo pipefail
python=${PYTHON:-python3}
out=${OUT:-gpu-results}
mkdir -p "$out"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

step() {
    echo "== $*"
    "$@"
    echo "== exit $?"
}

{
    step nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    step "$python" -c "import torch, transformers, hypothesis; print('torch', torch.__version__, 'transformers', transformers.__version__, 'hypothesis', hypothesis.__version__, torch.cuda.get_device_name())"
    step "$python" scripts/noise_floor.py --device cuda
    for dtype in bfloat16 float16; do
        step "$python" scripts/softmax_input_dtype.py --device cuda --dtype "$dtype" --tiny-llama
    done
    for dtype in bfloat16 float32; do
        step "$python" benchmarks/audit_overhead.py --model both --device cuda --dtype "$dtype" --repeats 3
    done
    # The 124M checkpoint stays outside $OUT: only small files come back from a lent machine.
    step "$python" -c "import sys; sys.path.insert(0, 'benchmarks'); from benchmark_models import gpt2_small; gpt2_small().save_pretrained('/tmp/gpt2-small')"
    for dtype in bfloat16 float16; do
        step "$python" -m maskcheck audit ref:tiny-decoder --device cuda --dtype "$dtype" --profile ci -q --json "$out/audit-ref-tiny-decoder-$dtype.json"
        step "$python" -m maskcheck audit hf:/tmp/gpt2-small --device cuda --dtype "$dtype" --profile ci -q --json "$out/audit-gpt2-small-$dtype.json"
        step "$python" -m maskcheck audit hf:/tmp/gpt2-small --device cuda --dtype "$dtype" --profile quick -q --json "$out/audit-gpt2-small-quick-$dtype.json"
        step "$python" -m maskcheck compare hf:/tmp/gpt2-small hf:/tmp/gpt2-small --attn-implementation eager,sdpa --device cuda --dtype "$dtype" --report "$out/compare-$dtype" --json "$out/compare-gpt2-small-eager-sdpa-$dtype.json"
    done
} 2>&1 | tee "$out/gpu-check.log"
