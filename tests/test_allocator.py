"""ktae.train.allocator: freed memory kept for reuse (glibc's mmap and trim thresholds)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ktae.train import allocator

GLIBC = allocator._glibc() is not None

# In its own process (the setting is process-wide and stays): where a 100 MB block lives,
# and whether its pages stay mapped once it is freed (the next one then reuses them instead
# of faulting in fresh pages; benchmarks/bench_step_ab.py measures what that saves).
SCRIPT = """
import json, sys, torch
from ktae.train.allocator import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else None
def mapping(address):
    for line in open("/proc/self/maps"):
        fields = line.split()
        low, high = (int(x, 16) for x in fields[0].split("-"))
        if low <= address < high:
            return fields[5] if len(fields) > 5 else "anonymous"
    return None
block = torch.empty(25_000_000)
block.fill_(1.0)
address = block.data_ptr() + block.nbytes // 2
where = mapping(address)
del block
print(json.dumps({"kept": kept, "where": where, "after_free": mapping(address)}))
"""


def _block(mode: str, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                         check=True, timeout=120, env={**os.environ, **(env or {})}).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc's")
def test_a_freed_large_block_stays_mapped_for_reuse():
    # glibc's default: a block above 32 MiB gets a mapping of its own, unmapped when freed
    default = _block("default")
    assert default["where"] == "anonymous" and default["after_free"] is None
    kept = _block("keep", {allocator.ENV: "1"})
    assert kept["kept"] is True and kept["where"] is not None
    assert kept["after_free"] == kept["where"]  # still mapped: the next block reuses it


@pytest.mark.skipif(not GLIBC, reason="the setting is glibc's")
def test_the_environment_switch_leaves_malloc_alone():
    off = _block("keep", {allocator.ENV: "0"})
    assert off["kept"] is False and off["after_free"] is None


@pytest.mark.parametrize("limit", [0, -1, 2**31, 1.5, True, "1"])
def test_bad_limit_is_refused(limit):
    with pytest.raises(ValueError, match="limit: expected a positive number of bytes"):
        allocator.keep_freed_memory(limit)


@pytest.mark.slow
def test_a_training_run_keeps_freed_memory(tiny_model, tmp_path, monkeypatch):
    """``ktae train``'s session asks for it once, before the model loads."""
    from test_train_helpers import contains_digit, tiny_config

    from ktae.train import session

    calls = []
    monkeypatch.setattr(session, "keep_freed_memory", lambda: calls.append(1) or False)
    session.train(tiny_config(tiny_model, tmp_path / "run", max_steps=1),
                  reward_funcs=[contains_digit])
    assert calls == [1]
