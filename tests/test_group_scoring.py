"""The per-group path of the audit and ``ktae explain`` (the prompt computed once, one
clean pass giving both the log-probs/entropies and the importance's reference) equals a
plain per-row computation: :func:`response_importance` with the prompt repeated, and a
full forward pass over prompt and response."""

import pytest
import torch

from ktae.core.entropy import categorical_entropy
from ktae.models.input_grad_importance import (
    group_importance,
    response_importance,
    response_logits,
)

VOCAB = 40
TOL = {"rtol": 1e-4, "atol": 1e-6}
"""float32: the prompt computed once for a row and the rows' padding change the order of
a few sums, nothing else."""


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128)
    return LlamaForCausalLM(cfg).float().eval()


def _rows(lengths, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _plain(model, prompt, responses, answer, conclusion, outcome, seed):
    B, T = len(responses), max(1, max(len(r) for r in responses))
    p = torch.tensor([prompt] * B)
    ids = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(responses):
        ids[i, :len(r)] = torch.tensor(r)
        mask[i, :len(r)] = 1
    return response_importance(model, p, torch.ones_like(p), ids, mask, [answer] * B, 0,
                               conclusion=conclusion, outcome=outcome,
                               generator=torch.Generator().manual_seed(seed))


def _cancellation(monkeypatch) -> list[float]:
    """The condition numbers of the KL objective's gradient, filled as the importance runs.

    For ``answer_mean`` and ``last`` the gradient reaching the logits is ``softmax(out) -
    q(e)``: two probability vectors about ``max q(e)`` in size whose difference is the
    noise's small effect, so each one's float32 rounding (``eps * max q(e)``) is amplified
    by ``kappa = max q(e) / max |softmax(out) - q(e)|`` relative to the gradient, and so
    to the importance that is linear in it. ``answer_joint`` has no such difference
    (kappa 1)."""
    import ktae.models.input_grad_importance as igi

    kappas: list[float] = []
    objective = igi._objective

    def recording(outcome, ref, out, p0, log_p0):
        if outcome != "answer_joint":
            grad = torch.softmax(out.detach(), dim=-1) - p0
            kappas.append((p0.amax() / grad.abs().amax()).item())
        return objective(outcome, ref, out, p0, log_p0)

    monkeypatch.setattr(igi, "_objective", recording)
    return kappas


@pytest.mark.parametrize("outcome", ["answer_mean", "last", "answer_joint"])
@pytest.mark.parametrize("conclusion", [[], [5, 6, 7]])
@pytest.mark.parametrize("prompt_len", [1, 2, 9])
def test_group_importance_equals_the_plain_computation(outcome, conclusion, prompt_len,
                                                        monkeypatch):
    """Equal to float32 rounding, scaled by the computation's conditioning, not by one
    CPU's rounding: the two paths sum in different orders, and their difference is about
    ``eps * kappa * max |s|`` (:func:`_cancellation`: the gradient's cancelling terms)
    plus ``eps * max |s|`` times a count of terms summed in the model's backward pass and
    in ``<grad, e_t>`` (16 for this two-layer, 32-wide model), four times over. An element
    far below ``max |s|`` carries the same absolute error, so no relative tolerance."""
    model = _llama()
    prompt = _rows([prompt_len], seed=2)[0]
    responses = _rows([7, 3, 12, 1, 12])
    kappas = _cancellation(monkeypatch)
    want = _plain(model, prompt, responses, [8, 9], conclusion, outcome, seed=4)
    got = group_importance(model, prompt, responses, [8, 9], 0, conclusion=conclusion,
                           outcome=outcome, generator=torch.Generator().manual_seed(4))
    assert got.shape == want.shape
    kappa = max(kappas, default=1.0)
    assert (kappa > 100) == (outcome != "answer_joint")  # the case the bound is for
    eps = torch.finfo(torch.float32).eps
    torch.testing.assert_close(got, want, rtol=0,
                               atol=4 * eps * (kappa + 16) * want.abs().max().item())
    assert (got[1, 3:] == 0).all() and (got[0, :7] > 0).all()


def test_the_clean_pass_logits_equal_a_full_forward():
    model = _llama()
    prompt = _rows([9], seed=2)[0]
    responses = _rows([7, 3, 12, 1])
    B, P, T = len(responses), len(prompt), 12
    ids = torch.zeros((B, P + T), dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, r in enumerate(responses):
        ids[i, :P + len(r)] = torch.tensor(prompt + r)
        att[i, :P + len(r)] = 1
    with torch.no_grad():
        want = model(input_ids=ids, attention_mask=att).logits[:, P - 1:P + T - 1]
    _, clean = group_importance(model, prompt, responses, [8], 0,
                                generator=torch.Generator().manual_seed(0), logits=True)
    plain = response_logits(model, prompt, responses, 0)
    for got in (clean, plain):
        assert got.shape == want.shape
        for i, r in enumerate(responses):  # padding positions are not read
            torch.testing.assert_close(got[i, :len(r)], want[i, :len(r)], **TOL)
            torch.testing.assert_close(categorical_entropy(got[i, :len(r)].log_softmax(-1)),
                                       categorical_entropy(want[i, :len(r)].log_softmax(-1)),
                                       **TOL)


def test_the_weights_keep_requires_grad_and_get_no_gradient():
    model = _llama()
    group_importance(model, [3, 4, 5], _rows([4, 2]), [8], 0,
                     generator=torch.Generator().manual_seed(0))
    assert all(p.requires_grad and p.grad is None for p in model.parameters())


@pytest.mark.parametrize("outcome", ["answer_mean", "last", "answer_joint"])
def test_a_reference_from_the_tail_equals_the_clean_pass(outcome):
    """The clean answer summary read from logits at the tail's positions (as the sampling's
    cache gives them, :func:`tail_reference`) gives the importance of the clean pass; float64,
    where the objective's amplification of rounding (a KL between two distributions 1e-3
    apart) stays far below the tolerance."""
    from ktae.models.input_grad_importance import tail_reference

    model = _llama().double()
    prompt = _rows([6], seed=2)[0]
    responses = _rows([7, 3, 12, 1])
    conclusion, answer = [5, 6, 7], [8, 9]
    logits = []
    for r in responses:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([prompt + r + conclusion + answer])).logits
        logits.append(out[0, -5:])
    ref = tail_reference(torch.stack(logits), conclusion, answer, outcome=outcome)
    want = group_importance(model, prompt, responses, answer, 0, conclusion=conclusion,
                            outcome=outcome, generator=torch.Generator().manual_seed(4))
    got = group_importance(model, prompt, responses, answer, 0, conclusion=conclusion,
                           outcome=outcome, generator=torch.Generator().manual_seed(4),
                           reference=ref)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-12)
    assert tail_reference(torch.stack(logits), [], [*conclusion, *answer]) is None
    with pytest.raises(ValueError, match="^logits: not with a reference"):
        group_importance(model, prompt, responses, answer, 0, conclusion=conclusion,
                         reference=ref, logits=True)


def test_length_chunks():
    from ktae.models.input_grad_importance import length_chunks

    assert length_chunks([]) == [[]] and length_chunks([5]) == [[0]]
    assert length_chunks([64, 64, 63, 64]) == [[0, 1, 2, 3]]  # nothing to save
    assert length_chunks([64, 10, 12, 64, 9, 11, 64, 13]) == [[1, 2, 4, 5, 7], [0, 3, 6]]
    chunks = length_chunks([30, 5, 64, 7, 40, 6, 64, 8], tail=4)
    assert sorted(i for c in chunks for i in c) == list(range(8)) and len(chunks) == 2


@pytest.mark.parametrize("logits", [False, True])
def test_split_rows_equal_one_batch(logits):
    """Rows of very different lengths computed in two sub-batches give the importance (and
    clean logits) of one batch: rows are independent and the noise is drawn for the whole
    group first. float64."""
    from ktae.models.input_grad_importance import length_chunks

    model = _llama().double()
    prompt = _rows([5], seed=2)[0]
    responses = _rows([20, 2, 3, 19, 1, 2])
    assert len(length_chunks([len(r) for r in responses], 5)) == 2
    kw = dict(conclusion=[5, 6, 7], logits=logits)
    one = group_importance(model, prompt, responses, [8, 9], 0, split=False,
                           generator=torch.Generator().manual_seed(4), **kw)
    two = group_importance(model, prompt, responses, [8, 9], 0,
                           generator=torch.Generator().manual_seed(4), **kw)
    if logits:
        (one, one_logits), (two, two_logits) = one, two
        for i, r in enumerate(responses):
            torch.testing.assert_close(two_logits[i, :len(r)], one_logits[i, :len(r)],
                                       rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(two, one, rtol=1e-7, atol=1e-12)
