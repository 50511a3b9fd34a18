"""Bad input raises ValueError naming the argument (not a TypeError or a torch error from
deep inside): strings, meta tensors, ids beyond int64, references too large for text."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
import torch

import ktae
from ktae.rewards import batch_math_reward, math_reward

META = torch.device("meta")


def _kw():
    return dict(rewards=torch.tensor([1.0, 0.0, 1.0, 0.0]), group=[0, 0, 1, 1],
                token_ids=torch.tensor([[1, 2], [1, 3], [4, 5], [6, 5]]),
                mask=torch.ones(4, 2, dtype=torch.bool))


@pytest.mark.parametrize("name", ["grpo", "ktae"])
@pytest.mark.parametrize("change, match", [
    (dict(rewards=["1", "0", "1", "0"]), "rewards: expected numbers, got strings"),
    (dict(rewards=np.array([b"1", b"0", b"1", b"0"])), "rewards: expected numbers, got strings"),
    (dict(rewards=[1.0, "x", 1.0, 0.0]), "rewards: expected numbers, got strings"),
    (dict(rewards=[[1.0], [0.0, 1.0]]), "rewards: expected a tensor or array"),
    (dict(rewards=torch.ones(4, device=META)), "rewards: expected a tensor with data"),
    (dict(group=torch.zeros(4, dtype=torch.long, device=META)), "group: expected a tensor with data"),
    (dict(token_ids=torch.ones(4, 2, dtype=torch.long, device=META)),
     "token_ids: expected a tensor with data"),
    (dict(token_ids=[["a", "b"]] * 4), "token_ids: expected numbers, got strings"),
    (dict(mask=torch.ones(4, 2, device=META)), "mask: expected a tensor with data"),
    (dict(mask=[["1", "1"]] * 4), "mask: expected numbers, got strings"),
])
def test_advantage_inputs(name, change, match):
    with pytest.raises(ValueError, match=match):
        ktae.compute_advantages(name, **{**_kw(), **change})


@pytest.mark.parametrize("ids", [
    np.array([[2**63, 2], [1, 3], [4, 5], [6, 5]], dtype=np.uint64),
    torch.tensor([[1, 2], [1, 3], [4, 5], [6, -1]]).to(torch.uint64),  # 2**64 - 1
])
def test_uint64_ids_beyond_int64_are_reported_as_they_are(ids):
    big = int(np.asarray(ids if isinstance(ids, np.ndarray) else ids.long().numpy()
                         ).astype(np.uint64).max())
    with pytest.raises(ValueError, match=rf"token_ids: expected ids below 2\*\*63 .* got {big} "):
        ktae.compute_advantages("ktae", **{**_kw(), "token_ids": ids})


def test_uint64_ids_that_fit_work_and_padding_is_not_checked():
    kw = _kw()
    expected = ktae.compute_advantages("ktae", **kw)
    ids = kw["token_ids"].numpy().astype(np.uint64)
    torch.testing.assert_close(ktae.compute_advantages("ktae", **{**kw, "token_ids": ids}),
                               expected)
    ids[3, 1] = 2**64 - 1  # in padding: never read
    mask = kw["mask"].clone()
    mask[3, 1] = False
    out = ktae.compute_advantages("ktae", **{**kw, "token_ids": ids, "mask": mask})
    assert torch.isfinite(out).all() and out[3, 1] == 0


@pytest.mark.parametrize("arg", ["logprobs", "old_logprobs", "advantages", "mask"])
def test_policy_loss_meta_and_string_inputs(arg):
    kw = dict(logprobs=torch.zeros(2, 3), old_logprobs=torch.zeros(2, 3),
              advantages=torch.ones(2), mask=torch.ones(2, 3))
    meta = {**kw, arg: torch.empty_like(kw[arg], device=META)}
    with pytest.raises(ValueError, match=f"{arg}: expected a tensor with data"):
        ktae.policy_loss(**meta)
    if arg != "logprobs":  # logprobs fixes the device; strings elsewhere are named
        strings = {**kw, arg: np.full(tuple(kw[arg].shape), "a")}
        with pytest.raises(ValueError, match=f"{arg}: expected numbers, got strings"):
            ktae.policy_loss(**strings)


@pytest.mark.parametrize("reference", [10**5000, -(10**5000), Fraction(1, 10**5000)],
                         ids=["int", "negative", "fraction"])
def test_math_reward_reference_too_large_for_text(reference):
    with pytest.raises(ValueError, match=r"reference: expected a number of at most \d+ digits, "
                                         r"got one of about 5001 digits"):
        math_reward("\\boxed{1}", reference)


def test_math_reward_accepts_numpy_numbers():
    assert math_reward("\\boxed{7}", np.int64(7)).correct
    assert math_reward("\\boxed{2.5}", np.float32(2.5)).correct
    assert math_reward("\\boxed{4}", np.float64(4.0)).correct
    assert math_reward("\\boxed{1/2}", Fraction(1, 2)).correct
    with pytest.raises(ValueError, match="reference: expected a finite number"):
        math_reward("\\boxed{1}", np.float64("inf"))


def test_batch_reward_errors_name_the_position():
    with pytest.raises(ValueError, match=r"references\[1\]: expected a number of at most"):
        batch_math_reward(["\\boxed{1}", "\\boxed{2}"], ["1", 10**5000])
    # a list is a set of accepted answers; a nested list or another type is refused
    assert batch_math_reward(["\\boxed{1}"], [[1]])[0].correct
    with pytest.raises(ValueError, match=r"references\[0\]: expected a list of accepted "
                       r"answers \(strings or numbers\), got a nested list at entry 1"):
        batch_math_reward(["\\boxed{1}"], [[1, [2]]])
    with pytest.raises(ValueError, match=r"references\[0\]: expected a string or number, got dict"):
        batch_math_reward(["\\boxed{1}"], [{"a": 1}])
    with pytest.raises(ValueError, match=r"completions\[1\]: expected a string, got NoneType"):
        batch_math_reward(["\\boxed{1}", None], ["1", "2"])
