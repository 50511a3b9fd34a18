"""Which path this CPU's bfloat16 products take, as ktae and PyTorch see it, and their cost
against float32 (docs/testing.md).

Usage:
    python benchmarks/bf16_path.py                          # the LM head's [8, 576] x [576, 49152]
    ONEDNN_MAX_CPU_ISA=AVX2 python benchmarks/bf16_path.py --expect emulated
    python benchmarks/bf16_path.py --rows 64 --repeats 3 --json out.json

In a child process with ``ONEDNN_VERBOSE=1`` (one torch thread): the ISA oneDNN reports,
a bfloat16 product ``[rows, 576] x [576, vocab]`` (SmolLM2-135M's LM head) and the same
in float32, each timed as the median CPU seconds of ``--repeats`` products after a
warm-up, and the implementation of every oneDNN primitive the bfloat16 product ran (none
where PyTorch does not route it through oneDNN: its own loops then emulate it). Prints
ktae's decision (:func:`ktae.train.precision.native_bf16`, the CPU's flag under oneDNN's
ISA limit), the CPU's own flag, PyTorch's CPU capability, those findings and bfloat16 over
float32.

``--expect emulated`` exits 1 unless the products are emulated: ktae sees no native
bfloat16, no oneDNN primitive of the bfloat16 product used an ISA with bfloat16
instructions (``avx512_core_bf16``, ``avx10``, ``amx``, ``avx2_vnni_2``), and the bfloat16
product took longer than float32's. ``--expect native`` exits 1 unless ktae sees native
bfloat16 and the bfloat16 product took less than float32's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ktae.train.precision import cpu_bf16, isa_limit, native_bf16  # noqa: E402

CHILD = """
import json, statistics, sys, time, torch
rows, vocab, repeats = (int(a) for a in sys.argv[1:4])
torch.set_num_threads(1)
gen = torch.Generator().manual_seed(0)
x, w = torch.randn(rows, 576, generator=gen), torch.randn(576, vocab, generator=gen) * 0.05
seconds = {}
for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
    a, b = x.to(dtype), w.to(dtype)
    print(f"bf16_path: start {name}", flush=True)
    a @ b  # warm-up (and oneDNN's primitive creation)
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        a @ b
        times.append(time.process_time() - t0)
    seconds[name] = statistics.median(times)
    print(f"bf16_path: end {name}", flush=True)
print("bf16_path: " + json.dumps({"seconds": seconds,
                                  "capability": torch.backends.cpu.get_cpu_capability()}))
"""

BF16_ISAS = ("avx512_core_bf16", "avx10", "amx", "avx2_vnni_2")
"""oneDNN implementation names (``brg_matmul:avx512_core_bf16`` and the like) whose ISA
has bfloat16 instructions."""


def probe(rows: int, vocab: int, repeats: int) -> dict:
    """The child's findings: seconds per product, PyTorch's capability, oneDNN's ISA line
    and the implementations of the primitives each product ran."""
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    out = subprocess.run([sys.executable, "-c", CHILD, str(rows), str(vocab), str(repeats)],
                         env=env, capture_output=True, text=True, check=True, timeout=3600).stdout
    isa, impls, current = None, {"float32": [], "bfloat16": []}, None
    result = None
    for line in out.splitlines():
        if line.startswith("bf16_path: start "):
            current = line.split()[-1]
        elif line.startswith("bf16_path: end "):
            current = None
        elif line.startswith("bf16_path: {"):
            result = json.loads(line[len("bf16_path: "):])
        elif line.startswith("onednn_verbose") and ",info,cpu,isa:" in line:
            isa = line.split(",info,cpu,isa:", 1)[1].strip()
        elif line.startswith("onednn_verbose") and ",exec,cpu," in line and current:
            fields = line.split(",")
            at = fields.index("cpu", fields.index("exec"))
            impls[current].append(f"{fields[at + 1]} {fields[at + 2]}")  # primitive, impl
    if result is None:
        raise SystemExit(f"bf16_path: the child printed no result:\n{out[-2000:]}")
    return {**result, "onednn_isa": isa, "onednn_impls": impls}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=8, help="rows of the product (default 8)")
    p.add_argument("--vocab", type=int, default=49152,
                   help="columns of the product (default 49152, SmolLM2's vocabulary)")
    p.add_argument("--repeats", type=int, default=3, help="timed products of each dtype")
    p.add_argument("--expect", choices=("emulated", "native"), default=None,
                   help="exit 1 unless the bfloat16 products take this path")
    p.add_argument("--json", type=Path, default=None)
    a = p.parse_args(argv)
    for name in ("rows", "vocab", "repeats"):
        if getattr(a, name) < 1:
            p.error(f"--{name}: expected a positive integer, got {getattr(a, name)}")
    found = probe(a.rows, a.vocab, a.repeats)
    bf16_impls = sorted(set(found["onednn_impls"]["bfloat16"]))
    ratio = found["seconds"]["bfloat16"] / found["seconds"]["float32"]
    result = {"ktae_native_bf16": native_bf16(), "cpu_bf16": list(cpu_bf16()),
              "onednn_max_cpu_isa": isa_limit(),
              "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"),
              "rows": a.rows, "vocab": a.vocab, "repeats": a.repeats, **found,
              "bf16_over_float32": ratio}
    print(f"ktae native bfloat16: {result['ktae_native_bf16']} (the CPU's flags: "
          f"{', '.join(result['cpu_bf16']) or 'none'}; "
          f"ONEDNN_MAX_CPU_ISA={result['onednn_max_cpu_isa']})")
    print(f"PyTorch CPU capability: {found['capability']}; oneDNN ISA: {found['onednn_isa']}")
    print(f"the bfloat16 product's oneDNN primitives: {', '.join(bf16_impls) or 'none'}")
    print(f"[{a.rows}, 576] x [576, {a.vocab}], one thread, median of {a.repeats}: float32 "
          f"{found['seconds']['float32'] * 1e3:.1f} ms, bfloat16 "
          f"{found['seconds']['bfloat16'] * 1e3:.1f} ms ({ratio:.2f}x)")
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    if a.expect == "emulated":
        fast = [i for i in bf16_impls if any(isa in i for isa in BF16_ISAS)]
        problems = ([f"ktae sees native bfloat16 ({result['ktae_native_bf16']})"]
                    * (result["ktae_native_bf16"] is not None)
                    + [f"oneDNN ran bfloat16 kernels: {', '.join(fast)}"] * bool(fast)
                    + [f"bfloat16 was not slower than float32 ({ratio:.2f}x)"] * (ratio <= 1))
        if problems:
            raise SystemExit("bf16_path: expected emulated bfloat16 products; " + "; ".join(problems))
    elif a.expect == "native":
        problems = (["ktae sees no native bfloat16"] * (result["ktae_native_bf16"] is None)
                    + [f"bfloat16 was not faster than float32 ({ratio:.2f}x)"] * (ratio >= 1))
        if problems:
            raise SystemExit("bf16_path: expected native bfloat16 products; " + "; ".join(problems))
    return result


if __name__ == "__main__":
    main()
