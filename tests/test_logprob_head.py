"""The ``full`` log-prob head against TRL 1.16's fused LM head, and its choice in training."""

from __future__ import annotations

import pytest
import torch
from test_train_helpers import contains_digit, read_jsonl, tiny_config

from ktae.runs.config import TrainConfig
from ktae.train.logprob_head import (
    FULL_HEAD_BUDGET,
    choose_head,
    full_head_peak_bytes,
    full_logps,
    trl_head_runs,
)

needs_trls_head = pytest.mark.skipif(
    not trl_head_runs(torch.device("cpu")),
    reason="this TRL's fused LM head runs with Triton on a CUDA or XPU device only (TRL 1.15)")


def _llama(vocab: int = 41):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      max_position_embeddings=64, tie_word_embeddings=True)
    return LlamaForCausalLM(cfg).float()


def _batch(vocab: int = 41):
    """Left-padded prompts of 5 positions, right-padded completions of 6."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, vocab, (3, 11), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0   # shorter prompt
    mask[2, :1] = 0
    mask[0, 9:] = 0   # shorter completions
    mask[2, 7:] = 0
    ids[mask == 0] = 0
    return ids, mask, 6


def _trl_pass(model, ids, mask, keep, temperature):
    """What TRL 1.16's ``_get_per_token_logps_and_entropies`` computes for one batch."""
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-keep] = -100
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    return out.log_probs[:, -keep:], out.entropy[:, -keep:]


def _grads(model) -> dict[str, torch.Tensor]:
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


@needs_trls_head
def test_full_head_equals_trls_fused_head_in_values_and_gradients():
    from trl.trainer.utils import add_fused_lm_head

    model = _llama()
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs", "entropy"))
    ids, mask, keep = _batch()
    w = torch.randn(3, keep, generator=torch.Generator().manual_seed(5))
    v = torch.randn(3, keep, generator=torch.Generator().manual_seed(6))

    lp_trl, ent_trl = _trl_pass(model, ids, mask, keep, 0.7)
    ((lp_trl * w).sum() + (ent_trl * v).sum()).backward()
    g_trl = _grads(model)
    lp, ent = full_logps(model, ids, mask, keep, 0.7, compute_entropy=True, entropy_grad=True)
    ((lp * w).sum() + (ent * v).sum()).backward()
    g_full = _grads(model)

    assert lp.shape == ent.shape == (3, keep)
    padding = mask[:, -keep:] == 0
    assert padding.any() and (lp[padding] == 0).all() and (ent[padding] == 0).all()
    torch.testing.assert_close(lp, lp_trl, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, ent_trl, rtol=1e-5, atol=1e-5)
    assert set(g_full) == set(g_trl)
    for name in g_trl:
        torch.testing.assert_close(g_full[name], g_trl[name], rtol=1e-4, atol=1e-6, msg=name)


def test_full_head_against_a_plain_softmax_of_each_row():
    """Straight from the definition: log softmax(logits / T) of the next token, row by row,
    entropy -sum p log p; no gradient through the entropy unless asked."""
    model = _llama()
    ids, mask, keep = _batch()
    lp, ent = full_logps(model, ids, mask, keep, 1.3, compute_entropy=True, entropy_grad=False)
    assert lp.requires_grad and not ent.requires_grad
    with torch.no_grad():
        for r in range(3):
            real = mask[r].bool()
            logits = model(input_ids=ids[r:r + 1, real]).logits[0].double() / 1.3
            n = int(mask[r, -keep:].sum())
            for j in range(n):  # completion token j sits at real position len - keep_r + j
                pos = int(real.sum()) - int(mask[r, -keep:].sum()) + j
                p = torch.softmax(logits[pos - 1], -1)
                tok = ids[r, real][pos]
                assert lp[r, j].item() == pytest.approx(torch.log(p[tok]).item(), abs=1e-5)
                assert ent[r, j].item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-5)


@pytest.mark.parametrize(("head", "device", "rows", "expected"), [
    ("auto", "cpu", 8, "full"),           # the recipe's micro-batch: a peak of 0.41 GB
    ("auto", "cpu", 10_000, "chunked"),   # 10,000 x 65 x 49,152 x 4 bytes > 1 GiB
    ("auto", "cuda", 8, "chunked"),
    ("full", "cuda", 10_000, "full"),
    ("chunked", "cpu", 8, "chunked")])
def test_choice_of_head(head, device, rows, expected):
    assert choose_head(head, torch.device(device), rows, 64, 49_152) == expected


@pytest.mark.parametrize(("rows", "grad", "entropy_grad", "expected"), [
    (45, False, False, "full"),      # logits 0.54 GiB, the peak's one tensor
    (45, True, False, "chunked"),    # peak 2 x 0.54 GiB: the logits and their gradient
    (40, True, False, "full"),       # 2 x 0.48 GiB and a chunk's buffer (3 MiB)
    (20, True, True, "chunked"),     # peak 5.25 x 0.24 GiB
    (20, False, True, "full")])      # no gradient at all: the entropy has none either
def test_auto_budgets_the_peak_not_the_logits(rows, grad, entropy_grad, expected):
    """Each of these micro-batches' logits fits in 1 GiB; the peak decides."""
    assert rows * 65 * 49_152 * 4 < FULL_HEAD_BUDGET
    assert choose_head("auto", torch.device("cpu"), rows, 64, 49_152, grad=grad,
                       entropy_grad=entropy_grad) == expected


def _peak_allocated(fn) -> int:
    """The most CPU memory torch's allocator held at once while ``fn`` ran, above what it
    held before, in bytes: the running sum of the profiler's allocation and free records.
    A count of bytes torch asked for, in program order on one thread: the same on every
    run, unlike the process's resident size."""
    from torch.profiler import ProfilerActivity, profile

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            fn()
    finally:
        torch.set_num_threads(threads)
    records = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    assert records, "the profiler recorded no allocation"
    held = peak = 0
    for e in sorted(records, key=lambda e: e.start_ns()):
        held += e.nbytes()
        peak = max(peak, held)
    return peak


@pytest.mark.parametrize(("grad", "entropy_grad"), [(False, False), (True, False), (True, True)])
def test_the_peak_estimate_matches_the_measured_peak(grad, entropy_grad):
    """The head's peak, forward and (with gradients) backward, on a model whose vocabulary
    dominates its memory, against :func:`full_head_peak_bytes`: within 5% above (what the
    estimate leaves out: the model's activations and parameter gradients, here under 1%)
    and 10% below."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab, rows, keep = 8000, 4, 63
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
        tie_word_embeddings=True)).float()
    ids = torch.randint(1, vocab, (rows, 5 + keep), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)

    def one_pass():
        with torch.set_grad_enabled(grad):
            lp, ent = full_logps(model, ids, mask, keep, 0.7, compute_entropy=True,
                                 entropy_grad=entropy_grad)
            if grad:
                (lp.sum() + ent.sum()).backward()
        model.zero_grad(set_to_none=True)

    one_pass()  # first-call allocations (e.g. the rotary cache) stay out of the measurement
    measured = _peak_allocated(one_pass)
    estimate = full_head_peak_bytes(rows, keep, vocab, grad=grad, entropy_grad=entropy_grad)
    assert 0.9 * estimate <= measured <= 1.05 * estimate, (measured, estimate)
    assert _peak_allocated(one_pass) == measured  # deterministic
    logits = rows * keep * vocab * 4
    assert measured > (2 if grad else 1) * logits  # the logits, and with gradients theirs


@pytest.mark.parametrize(("version", "device", "runs"), [
    ("1.16.0", "cpu", True), ("1.16.0", "cuda", True), ("1.15.0", "cpu", False),
    ("1.15.0", "meta", False)])
def test_where_trls_head_runs(version, device, runs):
    assert trl_head_runs(torch.device(device), version) is runs


def test_trls_head_on_a_cuda_device_needs_triton_under_trl_1_15(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "triton" else real(name, *a))
    assert trl_head_runs(torch.device("cuda"), "1.15.0")
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    assert not trl_head_runs(torch.device("cuda"), "1.15.0")


def test_auto_takes_the_full_head_where_trls_cannot_run():
    huge = 4096  # rows whose full-head peak is far over the budget
    assert choose_head("auto", torch.device("cpu"), huge, 64, 49_152) == "chunked"
    assert choose_head("auto", torch.device("cpu"), huge, 64, 49_152, trl_head=False) == "full"
    assert choose_head("chunked", torch.device("cpu"), 1, 64, 49_152, trl_head=False) == "chunked"


def test_chunked_is_refused_where_trls_head_cannot_run(tiny_model, tmp_path, monkeypatch):
    import trl

    from ktae.train import trainer as trainer_module
    from ktae.train.session import train

    monkeypatch.setattr(trl, "__version__", "1.15.0")
    monkeypatch.setattr(trainer_module, "TRL_VERSION", "1.15.0")
    cfg = tiny_config(tiny_model, tmp_path / "run", logprob_head="chunked")
    with pytest.raises(ValueError, match=r"^logprob_head: logprob_head='chunked' runs TRL's fused "
                                         r"LM head, which trl 1\.15\.0 computes with Triton"):
        train(cfg, reward_funcs=[contains_digit])


def test_a_bad_head_is_one_line_naming_the_setting():
    with pytest.raises(ValueError, match=r"^logprob_head: expected one of auto, full, chunked, "
                                         r"got 'fast'$"):
        TrainConfig(logprob_head="fast").resolve()
    with pytest.raises(ValueError, match="logprob_head: expected"):
        choose_head("fast", torch.device("cpu"), 1, 1, 1)


@pytest.mark.slow
@needs_trls_head
@pytest.mark.parametrize("lora_r", [0, 4])
def test_training_with_the_full_head_matches_trls_head(tiny_model, tmp_path, monkeypatch,
                                                       lora_r):
    """Two steps from the same seed under each head: the full head ran every policy pass
    of the first run and none of the second, and the steps agree to float rounding."""
    from ktae.train import trainer as trainer_module
    from ktae.train.session import train

    calls = []

    def counted(*args, **kwargs):
        calls.append(torch.is_grad_enabled())
        return full_logps(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "full_logps", counted)
    metrics = {}
    for head in ("full", "chunked"):
        calls.clear()
        cfg = tiny_config(tiny_model, tmp_path / head, logprob_head=head, lora_r=lora_r,
                          beta=0.04, seed=3)
        train(cfg, reward_funcs=[contains_digit])
        metrics[head] = read_jsonl(tmp_path / head / "metrics.jsonl")
        # the loss's policy pass (with gradients) of each step, and the reference passes
        # (beta > 0) of every generation round
        if head == "full":
            assert sum(calls) == 2 and len(calls) >= 4, calls
        else:
            assert not calls
    for a, b in zip(metrics["full"], metrics["chunked"], strict=True):
        for key in ("reward", "loss", "grad_norm", "entropy", "kl"):
            assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-6), key

