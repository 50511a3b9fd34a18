#!/usr/bin/env bash
# ktae train's step on SmolLM2-135M-Instruct with transformers' generation, then with
# colocated vLLM generation: the same 3 steps (4 prompts x 8 samples, 48 new tokens, the arith
# task at difficulty 1, one thread), one run after the other; each step's parts are in
# OUT/{hf,vllm}/metrics.jsonl.
#   PYTHON=/path/to/vllm-env/bin/python benchmarks/vllm_step_time.sh OUT
set -euo pipefail
out=${1:?usage: vllm_step_time.sh OUT}
python=${PYTHON:-python}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-2}
common=(--model smollm2-135m --task arith@difficulty=1 --reward number --template chat
        --max-steps 3 --num-prompts 4 --num-generations 8 --max-new-tokens 48 --temperature 0.7
        --eval-size 4 --eval-every 0 --no-progress --threads 1 --save-every 0)
mkdir -p "$out"
rm -rf "$out/hf" "$out/vllm"
"$python" -m ktae train "${common[@]}" --output-dir "$out/hf"
"$python" -m ktae train "${common[@]}" --output-dir "$out/vllm" \
    --trl use_vllm=true --trl vllm_mode=colocate
"$python" - "$out" <<'PY'
import json, sys
for name in ("hf", "vllm"):
    rows = [json.loads(line) for line in open(f"{sys.argv[1]}/{name}/metrics.jsonl")]
    for key in ("step_time", "generation_seconds", "logprob_seconds", "update_seconds"):
        values = [r[key] for r in rows]
        print(f"{name:5s} {key:20s} " + " ".join(f"{v:6.1f}" for v in values)
              + f"   mean {sum(values) / len(values):6.1f}")
PY
