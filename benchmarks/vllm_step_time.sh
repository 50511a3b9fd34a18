#!/usr/bin/env bash
# ktae train's step on the recipe (configs/smollm2-recipe.yaml) with transformers' generation
# and with colocated vLLM generation, alternating hf, vllm, hf, vllm, hf (3 steps each, each
# run in its own process), then the sync costs and the log-prob tolerance in one process:
# benchmarks/bench_vllm_step.py (its docstring says what each mode measures).
#   PYTHON=/path/to/vllm-env/bin/python benchmarks/vllm_step_time.sh OUT
set -euo pipefail
out=${1:?usage: vllm_step_time.sh OUT}
python=${PYTHON:-python}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}
here=$(dirname "$0")
mkdir -p "$out"
"$python" "$here/bench_vllm_step.py" steps --out-dir "$out/steps" --steps 3 --rounds 2 --bracket 1
"$python" "$here/bench_vllm_step.py" parts --out "$out/parts.json"
"$python" "$here/bench_vllm_step.py" parts --vllm-lora --out "$out/parts-lora.json" \
    --out-dir-lora "$out/adapters"
