"""KTAE's values do not depend on chunking, thread count or where a value sits in an array:
bit for bit, both sides computed live on this machine (``ktae.core.chunk_pool``,
``ktae.core.pointwise``)."""

from __future__ import annotations

import multiprocessing
import threading

import pytest
import torch
from oracle import random_batch

import ktae
from ktae.core import pointwise
from ktae.core.chunk_pool import one_thread_caller, run_tasks

CHUNKS = (None, 1, 7, 50, 333, 10**9)
OPTIONS = (dict(), dict(mode="reference"), dict(ngram=3), dict(ngram=2, ngram_reduce="maxabs"),
           dict(variant="paper", base="rloo"), dict(ignore_token_ids=[3, 5]))


@pytest.fixture
def threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def _layouts(seed: int) -> list[dict]:
    """One batch with its groups interleaved, and the same with each group's responses
    stored one after the other (the layout chunks take as views)."""
    kw = random_batch(seed, sizes=[8] * 10 + [5, 3, 16, 1], vocab=60, max_len=40)
    order = sorted(range(len(kw["group"])), key=lambda i: kw["group"][i])
    contiguous = {"rewards": kw["rewards"][order], "group": [kw["group"][i] for i in order],
                  "token_ids": kw["token_ids"][order], "mask": kw["mask"][order]}
    return [kw, contiguous]


@pytest.mark.parametrize("options", OPTIONS, ids=str)
def test_values_do_not_depend_on_chunking_or_threads(options, threads):
    for seed in range(2):
        for kw in _layouts(seed):
            for dtype in (torch.float32, torch.float64):
                rewards = torch.as_tensor(kw["rewards"]).to(dtype)
                args = {**kw, "rewards": rewards, **options}
                torch.set_num_threads(1)
                ref = ktae.compute_advantages("ktae", **args, chunk_tokens=10**9)
                for n in (1, 2, 3):
                    torch.set_num_threads(n)
                    for chunk in CHUNKS:
                        out = ktae.compute_advantages("ktae", **args, chunk_tokens=chunk)
                        assert torch.equal(out, ref), (options, seed, dtype, n, chunk)


@pytest.mark.parametrize("options", OPTIONS[:3], ids=str)
def test_key_token_table_does_not_depend_on_chunking_or_threads(options, threads):
    kw = _layouts(0)[1]
    torch.set_num_threads(1)
    ref = ktae.key_token_table(**kw, **options, chunk_tokens=10**9)
    for n, chunk in ((2, 7), (3, 50), (2, None)):
        torch.set_num_threads(n)
        table = ktae.key_token_table(**kw, **options, chunk_tokens=chunk)
        for f in ("group", "token", "a", "b", "p_value", "fisher", "info_gain", "tf_correct",
                  "tf_incorrect", "direction", "value"):
            assert torch.equal(getattr(table, f), getattr(ref, f)), (options, n, chunk, f)


def test_a_large_batch_is_the_same_at_every_thread_count(threads):
    """Large enough for several default-sized chunks and for torch to split the caller's
    own operations between threads."""
    kw = random_batch(5, sizes=[16] * 48, vocab=3000, max_len=700)
    assert int(torch.as_tensor(kw["mask"]).sum()) > 1 << 18
    outs = []
    for n in (1, 2, 4):
        torch.set_num_threads(n)
        outs.append(ktae.compute_advantages("ktae", **kw))
        outs.append(ktae.compute_advantages("ktae", **kw, mode="reference"))
    for a, b in zip(outs[2:], outs[:-2], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fn", [pointwise.exp, pointwise.log2, pointwise.asin, pointwise.lgamma,
                                pointwise.sigmoid], ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pointwise_value_does_not_depend_on_position(fn, dtype):
    x = torch.rand(1000, dtype=dtype, generator=torch.Generator().manual_seed(0)) * 0.9 + 0.05
    whole = fn(x)
    for start, stop in ((0, 1), (3, 70), (1, 1000), (64, 128), (999, 1000), (0, 63)):
        assert torch.equal(fn(x[start:stop]), whole[start:stop]), (start, stop)
    assert torch.equal(fn(x.reshape(10, 100).t()), whole.reshape(10, 100).t())
    assert torch.allclose(whole, getattr(torch, fn.__name__)(x), rtol=1e-6, atol=0)


def test_tasks_keep_order_and_the_callers_threads(threads):
    torch.set_num_threads(2)
    seen = []

    def work(i):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return i * i

    assert run_tasks(work, range(20), device=torch.device("cpu")) == [i * i for i in range(20)]
    assert torch.get_num_threads() == 2
    assert all(name.startswith("ktae-task") and n == 1 for name, n in seen)
    torch.set_num_threads(1)  # one thread: in the calling thread
    seen.clear()
    assert run_tasks(work, range(3), device=torch.device("cpu")) == [0, 1, 4]
    assert {name for name, _ in seen} == {threading.current_thread().name}


def test_a_failing_task_raises_after_the_others_finish(threads):
    torch.set_num_threads(2)
    done = []

    def work(i):
        if i == 1:
            raise ValueError("task 1 failed")
        done.append(i)

    with pytest.raises(ValueError, match="task 1 failed"):
        run_tasks(work, range(6), device=torch.device("cpu"))
    assert sorted(done) == [0, 2, 3, 4, 5] and torch.get_num_threads() == 2


def _in_forked_child(queue):
    torch.set_num_threads(2)
    kw = random_batch(1, sizes=[8] * 6, vocab=30, max_len=20)
    queue.put(float(ktae.compute_advantages("ktae", **kw, chunk_tokens=50).abs().sum()))


def test_a_forked_child_gets_its_own_task_threads(threads):
    torch.set_num_threads(2)
    kw = random_batch(1, sizes=[8] * 6, vocab=30, max_len=20)
    expected = float(ktae.compute_advantages("ktae", **kw, chunk_tokens=50).abs().sum())
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_in_forked_child, args=(queue,))
    child.start()
    child.join(60)
    assert child.exitcode == 0, "the forked child hung or failed"
    assert queue.get(timeout=5) == expected


def test_entry_points_run_on_one_thread_and_keep_the_callers_setting(threads):
    torch.set_num_threads(2)
    inside = {}

    @one_thread_caller
    def entry():
        inside["own"] = torch.get_num_threads()
        inside["tasks"] = run_tasks(lambda _: threading.current_thread().name, range(4),
                                    device=torch.device("cpu"))
        inside["nested"] = nested()
        return 7

    @one_thread_caller
    def nested():
        return torch.get_num_threads()

    assert entry() == 7 and torch.get_num_threads() == 2
    assert inside["own"] == 1 and inside["nested"] == 1
    assert all(name.startswith("ktae-task") for name in inside["tasks"])
    kw = random_batch(2, sizes=[8] * 4, vocab=30, max_len=20)
    ktae.compute_advantages("ktae", **kw)
    ktae.calibrate_advantages("taco", torch.ones(32), logprobs=-torch.rand(32, 20),
                              entropies=torch.rand(32, 20), mask=torch.ones(32, 20))
    assert torch.get_num_threads() == 2


def test_policy_loss_gradients_are_the_one_thread_ones(threads):
    """On several threads the loss and its gradients come from one pass on one thread
    (``_PrecomputedGradients``): the same bits as plain autograd on one thread."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 9, generator=g)
    old = -torch.rand(6, 9, generator=g)
    adv = torch.randn(6, 9, generator=g)
    mask = torch.rand(6, 9, generator=g) < 0.8
    ref = -torch.rand(6, 9, generator=g)
    settings = dict(clip_high=0.28, dual_clip=3.0, ref_logprobs=ref, kl_coef=0.1,
                    entropy_coef=0.01, aggregation="seq-mean-token-mean")

    def run(n):
        torch.set_num_threads(n)
        x = logits.clone().requires_grad_()
        lp = torch.nn.functional.logsigmoid(x)
        ent = torch.sigmoid(x) * 2.0  # a graph into x, as a policy's entropies have
        loss, metrics = ktae.policy_loss(lp, old, adv, mask, entropies=ent, **settings)
        loss.backward()
        return loss.detach(), metrics, x.grad

    one, two = run(1), run(2)
    assert torch.equal(one[0], two[0]) and one[1] == two[1]
    assert torch.equal(one[2], two[2])
    with torch.no_grad():
        loss, _ = ktae.policy_loss(logits, old, adv, mask)
    assert not loss.requires_grad


@pytest.mark.parametrize("ngram", [1, 2])
def test_graded_split_does_not_depend_on_chunking_or_threads(ngram, threads):
    kw = random_batch(4, sizes=[8] * 10 + [5, 3], vocab=60, max_len=40, reward_kind="continuous")
    torch.set_num_threads(1)
    ref = ktae.compute_advantages("ktae", **kw, split="graded", ngram=ngram, chunk_tokens=10**9)
    for n, chunk in ((1, 7), (2, 50), (3, None), (2, 1)):
        torch.set_num_threads(n)
        out = ktae.compute_advantages("ktae", **kw, split="graded", ngram=ngram, chunk_tokens=chunk)
        assert torch.equal(out, ref), (ngram, n, chunk)
