"""``ngram=1`` (the default) reproduces KTAE's output from before n-gram support, bit for bit.

``tests/data/ktae_unigram_golden.npz`` holds inputs, options, advantages (float64 and
float32 rewards) and key-token tables computed by the library before spans were added,
on 8 batches covering both modes, both variants, all bases, ignored ids, chunking, empty
responses and continuous rewards. Elementwise math kernels may round differently on
another CPU (vector width) or torch version; there, the comparison falls back to 1e-12.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
import torch
from oracle import single_thread  # noqa: F401  (autouse fixture)

import ktae

GOLDEN = np.load(Path(__file__).parent / "data" / "ktae_unigram_golden.npz")
CASES = sorted({k.split("_")[0] for k in GOLDEN.files if k[0] == "c" and k[1].isdigit()})
SAME_PLATFORM = (str(GOLDEN["torch_version"]) == torch.__version__
                 and str(GOLDEN["cpu_capability"]) == torch.backends.cpu.get_cpu_capability())
TABLE_FIELDS = ("group", "token", "a", "b", "c", "d", "p_value", "fisher", "info_gain",
                "tf_correct", "tf_incorrect", "direction", "value")


def _same(got: np.ndarray, expect: np.ndarray, what: str) -> None:
    assert got.shape == expect.shape and got.dtype == expect.dtype, what
    if SAME_PLATFORM or not np.issubdtype(expect.dtype, np.floating):
        assert np.array_equal(got, expect), f"{what}: differs from the golden output"
    else:
        np.testing.assert_allclose(got, expect, rtol=0, atol=1e-12, err_msg=what)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("ngram", [None, 1])
def test_unigram_ktae_is_unchanged(case, ngram):
    g = {k[len(case) + 1:]: GOLDEN[k] for k in GOLDEN.files if k.startswith(case + "_")}
    opts = ast.literal_eval(str(g["opts"]))
    if ngram is not None:
        opts["ngram"] = ngram
    inputs = dict(group=g["group"].tolist(), token_ids=g["token_ids"], mask=g["mask"])
    for dtype in ("float64", "float32"):
        rewards = torch.from_numpy(g["rewards"]).to(getattr(torch, dtype))
        adv = ktae.compute_advantages("ktae", rewards=rewards, **inputs, **opts)
        _same(adv.numpy(), g["adv_" + dtype], f"{case} advantages ({dtype} rewards)")
    opts.pop("chunk_tokens", None)
    table = ktae.key_token_table(rewards=torch.from_numpy(g["rewards"]), **inputs, **opts)
    assert table.span is None
    for f in TABLE_FIELDS:
        _same(getattr(table, f).numpy(), g["table_" + f], f"{case} table column {f}")
