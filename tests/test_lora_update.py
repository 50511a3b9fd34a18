"""The LoRA update's log-prob pass (``ktae.train.logprob_head.full_logps`` with gradients)
against autograd's plain chain on a small random Llama with peft LoRA adapters: the same
log-probabilities, entropies, GRPO loss and adapter gradients, within float rounding."""

from __future__ import annotations

import pytest
import torch

from ktae.train import logprob_head
from ktae.train.logprob_head import TokenLogProbs, chunk_positions, full_logps, prefix_groups

peft = pytest.importorskip("peft")


def _lora_llama(vocab: int = 53):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=True)).float()
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                             task_type="CAUSAL_LM", init_lora_weights=False)
    return peft.get_peft_model(model, config)


def _batch(vocab: int = 53):
    """Left-padded prompts of 6 positions, right-padded completions of 7."""
    g = torch.Generator().manual_seed(4)
    ids = torch.randint(2, vocab, (4, 13), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    mask[3, :1] = 0
    mask[0, 10:] = 0
    mask[2, 8:] = 0
    ids[mask == 0] = 0
    return ids, mask, 7


def _autograd_logps(model, ids, mask, keep, temperature):
    """The head as autograd's chain: logits of the kept positions, log-softmax, gather."""
    logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=keep + 1,
                   use_cache=False).logits
    logp = torch.log_softmax(logits[:, :-1].float() / temperature, dim=-1)
    padding = mask[:, -keep:] == 0
    per_token = logp.gather(-1, ids[:, -keep:, None]).squeeze(-1).masked_fill(padding, 0.0)
    with torch.no_grad():
        p = logp.exp()
        entropy = -(p * logp).sum(-1).masked_fill(padding, 0.0)
    return per_token, entropy


def _grpo_loss(logps, mask, advantages, epsilon=0.2):
    """TRL 1.16's clipped GRPO loss, one micro-batch, on-policy (old = current, detached)."""
    ratio = torch.exp(logps - logps.detach())
    clipped = torch.clamp(ratio, 1 - epsilon, 1 + epsilon)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    m = mask.float()
    return ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1)).mean()


def _adapter_grads(model):
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


@pytest.mark.parametrize("temperature", [0.6, 1.0])
def test_loss_and_lora_gradients_equal_autograds_chain(temperature):
    model = _lora_llama()
    model.train()
    ids, mask, keep = _batch()
    advantages = torch.randn(4, keep, generator=torch.Generator().manual_seed(7))
    completion_mask = mask[:, -keep:]

    lp_ref, ent_ref = _autograd_logps(model, ids, mask, keep, temperature)
    loss_ref = _grpo_loss(lp_ref, completion_mask, advantages)
    loss_ref.backward()
    g_ref = _adapter_grads(model)

    lp, ent = full_logps(model, ids, mask, keep, temperature, compute_entropy=True,
                         entropy_grad=False)
    loss = _grpo_loss(lp, completion_mask, advantages)
    loss.backward()
    g_new = _adapter_grads(model)

    assert not ent.requires_grad
    assert type(lp.grad_fn.next_functions[0][0]).__name__ == "TokenLogProbsBackward"
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(loss, loss_ref, rtol=1e-6, atol=1e-7)
    assert g_ref and set(g_new) == set(g_ref)
    assert all("lora_" in name for name in g_new)  # the frozen weights get none
    for name, g in g_ref.items():
        assert g.abs().max() > 0, name
        # float32 summation order differs between CPU kernels (avx2, avx512): the error
        # scales with the gradient's largest entries, not with each entry
        torch.testing.assert_close(g_new[name], g, rtol=1e-5, atol=1e-5 * g.abs().max().item(),
                                   msg=name)
    head = model.get_output_embeddings()
    assert not head._forward_pre_hooks  # the contiguous-input hook is removed


def _group_batch(vocab: int = 53):
    """Three responses to one left-padded prompt and three to another, shuffled as TRL
    shuffles a generation batch; right-padded completions of 7."""
    g = torch.Generator().manual_seed(4)
    prompts = torch.randint(2, vocab, (2, 6), generator=g)
    prompt_mask = torch.ones_like(prompts)
    prompt_mask[1, :2] = 0
    prompts[prompt_mask == 0] = 0
    of = [1, 0, 0, 1, 1, 0]
    completions = torch.randint(2, vocab, (6, 7), generator=g)
    completion_mask = torch.ones_like(completions)
    completion_mask[0, 4:] = 0
    completion_mask[3, 2:] = 0
    completions[completion_mask == 0] = 0
    return (torch.cat([prompts[of], completions], 1),
            torch.cat([prompt_mask[of], completion_mask], 1), 7)


def _count_forwards(model, monkeypatch) -> list:
    """The ``input_ids`` shape of each call of ``model``'s forward from now on."""
    calls = []
    forward = type(model).forward

    def counted(self, *args, **kwargs):
        calls.append(kwargs["input_ids"].shape)
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", counted)
    return calls


def test_prefix_groups_finds_rows_sharing_a_prefix():
    ids, mask, keep = _group_batch()
    split = ids.size(1) - keep

    def partition(group):  # which rows go together, whatever the groups' numbering
        return sorted(sorted(i for i in range(len(group)) if group[i] == g) for g in set(group))

    first, group = prefix_groups(ids, mask, split)
    assert partition(group.tolist()) == [[0, 3, 4], [1, 2, 5]]
    assert sorted(first.tolist()) == [0, 1] and (group[first] == torch.arange(2)).all()
    # the same tokens under another mask are another prefix; distinct rows share nothing
    other = mask.clone()
    other[2, 0] = 0
    assert partition(prefix_groups(ids, other, split)[1].tolist()) == [[0, 3, 4], [1, 5], [2]]
    assert prefix_groups(ids[:2], mask[:2], ids.size(1) - keep) is None
    assert prefix_groups(ids, mask, 0) is None


@pytest.mark.parametrize("grad", [True, False])
def test_shared_prefix_equals_the_whole_forward(grad, monkeypatch):
    """Rows sharing a prompt run it once (two calls of the model: the distinct prefixes,
    then every row's kept positions on their cache) and give the whole forward's
    log-probabilities, entropies, loss and adapter gradients."""
    model = _lora_llama()
    model.train()
    ids, mask, keep = _group_batch()
    advantages = torch.randn(6, keep, generator=torch.Generator().manual_seed(7))
    completion_mask = mask[:, -keep:]
    with torch.set_grad_enabled(grad):
        lp_ref, ent_ref = _autograd_logps(model, ids, mask, keep, 0.7)
        if grad:
            _grpo_loss(lp_ref, completion_mask, advantages).backward()
        g_ref = _adapter_grads(model) if grad else {}

        calls = _count_forwards(model, monkeypatch)
        lp, ent = full_logps(model, ids, mask, keep, 0.7, compute_entropy=True,
                             entropy_grad=False)
        assert calls == [torch.Size([2, 5]), torch.Size([6, 8])]  # prompt but its last token
        if grad:
            _grpo_loss(lp, completion_mask, advantages).backward()
        g_new = _adapter_grads(model) if grad else {}
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-6, atol=1e-6)
    assert set(g_new) == set(g_ref)
    for name, g in g_ref.items():
        assert g.abs().max() > 0, name
        torch.testing.assert_close(g_new[name], g, rtol=1e-5, atol=1e-5 * g.abs().max().item(),
                                   msg=name)


def test_shared_prefix_steps_aside_where_it_cannot_apply(monkeypatch):
    """No repeated prefix, or gradient checkpointing (no cache): one whole forward."""
    model = _lora_llama()
    ids, mask, keep = _group_batch()
    calls = _count_forwards(model, monkeypatch)
    with torch.no_grad():
        logprob_head.shared_prefix_logits(model, ids[:2], mask[:2], keep + 1)
        assert calls == [torch.Size([2, 13])]
        monkeypatch.setattr(logprob_head, "_shares_prefix", lambda model: False)
        logprob_head.shared_prefix_logits(model, ids, mask, keep + 1)
        assert calls[-1] == torch.Size([6, 13]) and len(calls) == 2


@pytest.mark.parametrize("chunk_bytes", [None, 1, 3 * 11 * 4])
def test_token_logprobs_backward_is_the_log_softmax_derivative(monkeypatch, chunk_bytes):
    """``g (onehot - softmax) / T`` at every kept position, 0 at the last one, in float64;
    the same in one chunk a row, a position a chunk, and chunks of 3 (the last short)."""
    if chunk_bytes is not None:
        monkeypatch.setattr(logprob_head, "CHUNK_BYTES", chunk_bytes)
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 8, 11, dtype=torch.float64, generator=g, requires_grad=True)
    logits.data[0, 1, 3] = float("-inf")  # a banned entry: probability 0, gradient 0
    targets = torch.randint(0, 11, (2, 7), generator=g)
    targets[0, 1] = 4
    per_token, entropy = TokenLogProbs.apply(logits, targets, 0.7, False)
    assert per_token.dtype == torch.float32 and entropy is None
    weight = torch.randn(2, 7, generator=g)
    (per_token * weight).sum().backward()
    with torch.no_grad():
        logp = torch.log_softmax(logits[:, :-1].float() / 0.7, dim=-1)
        expected = torch.nn.functional.one_hot(targets, 11).float() - logp.exp()
        expected = torch.cat([expected * weight[..., None] / 0.7,
                              torch.zeros(2, 1, 11)], dim=1).double()
    torch.testing.assert_close(per_token, logp.gather(-1, targets[..., None]).squeeze(-1),
                               rtol=0, atol=1e-6)
    assert logits.grad.dtype == torch.float64
    torch.testing.assert_close(logits.grad, expected, rtol=1e-5, atol=1e-6)
    assert logits.grad[0, 1, 3] == 0


@pytest.mark.parametrize("chunk_bytes", [None, 1, 2 * 9 * 4])
def test_token_logprobs_entropy_with_banned_entries(monkeypatch, chunk_bytes):
    """``-sum p log p`` with ``0 log 0 = 0``, without gradient: a position with a ``-inf``
    logit gets the entropy of the entries left, not NaN; the others are
    ``categorical_entropy``'s. The log-probabilities are those without the entropy."""
    from ktae.core.entropy import categorical_entropy

    if chunk_bytes is not None:
        monkeypatch.setattr(logprob_head, "CHUNK_BYTES", chunk_bytes)
    logits = torch.randn(2, 4, 9, generator=torch.Generator().manual_seed(3)) * 4
    logits[1, 2, :4] = float("-inf")
    targets = torch.tensor([[0, 1, 2], [3, 4, 8]])
    leaf = logits.clone().requires_grad_()
    per_token, h = TokenLogProbs.apply(leaf, targets, 0.9, True)
    assert per_token.requires_grad and not h.requires_grad
    assert torch.isfinite(h).all()
    logp = torch.log_softmax(logits[:, :-1] / 0.9, -1)
    torch.testing.assert_close(h, categorical_entropy(logp), rtol=1e-6, atol=1e-6)
    kept = torch.log_softmax(logits[1, 2, 4:] / 0.9, -1)
    torch.testing.assert_close(h[1, 2], -(kept.exp() * kept).sum())
    alone, _ = TokenLogProbs.apply(logits, targets, 0.9, False)
    torch.testing.assert_close(per_token, alone, rtol=0, atol=1e-6)


def test_chunk_positions_spread_evenly_within_the_budget():
    assert logprob_head.CHUNK_BYTES == 4 << 20
    assert chunk_positions(64, 49152) == 16  # at most 21 fit: 4 chunks of 16
    assert chunk_positions(64, 151936) == 6  # at most 6 fit: 11 chunks (10 of 6, one of 4)
    assert chunk_positions(5, 11) == 5  # a small vocabulary: the row at once
    assert chunk_positions(3, 10 << 20) == 1  # at least one position
    assert chunk_positions(0, 11) == 1


def test_no_gradient_pass_is_unchanged():
    """Without gradients (the old-policy and reference passes) the same values come back."""
    model = _lora_llama()
    ids, mask, keep = _batch()
    with torch.no_grad():
        lp_ref, ent_ref = _autograd_logps(model, ids, mask, keep, 0.8)
        lp, ent = full_logps(model, ids, mask, keep, 0.8, compute_entropy=True,
                             entropy_grad=False)
    torch.testing.assert_close(lp, lp_ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(ent, ent_ref, rtol=1e-6, atol=1e-6)


def test_fused_lora_runs_only_plain_adapters_and_restores_peft():
    from ktae.train.lora_forward import fused_lora, plain_adapter

    model = _lora_llama()
    ids, mask, keep = _batch()
    layers = [m for m in model.modules() if isinstance(m, peft.tuners.lora.Linear)]
    assert layers and all(plain_adapter(m) == "default" for m in layers)
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask).logits
        with fused_lora(model) as count:
            assert count == len(layers)
            assert all("forward" in vars(m) for m in layers)
            fused = model(input_ids=ids, attention_mask=mask).logits
        assert not any("forward" in vars(m) for m in layers)
        torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-6)
        with model.disable_adapter():  # the reference pass: peft's forward, no adapter
            assert all(plain_adapter(m) is None for m in layers)
            with fused_lora(model) as count:
                assert count == 0
                base = model(input_ids=ids, attention_mask=mask).logits
        assert not torch.allclose(base, plain)
    layers[0].lora_dropout["default"] = torch.nn.Dropout(0.1)  # dropout: peft's forward
    assert plain_adapter(layers[0]) is None


def test_fused_lora_forward_is_the_adapted_linear_map():
    """``x W^T + b + scaling (x A^T) B^T``, against float64 on one layer with a bias."""
    from ktae.train.lora_forward import fused_lora_forward

    torch.manual_seed(1)
    layer = torch.nn.Sequential(torch.nn.Linear(6, 5))
    model = peft.get_peft_model(layer, peft.LoraConfig(r=2, lora_alpha=6, target_modules=["0"],
                                                       init_lora_weights=False))
    module = model.base_model.model[0]
    x = torch.randn(3, 4, 6)
    out = fused_lora_forward(module, "default", x)
    W, b = module.base_layer.weight.double(), module.base_layer.bias.double()
    A, B = module.lora_A["default"].weight.double(), module.lora_B["default"].weight.double()
    expected = x.double() @ W.T + b + 3.0 * (x.double() @ A.T) @ B.T
    assert module.scaling["default"] == 3.0
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


def test_fused_lora_under_autocast_matches_peft_in_bfloat16(monkeypatch):
    """``--bf16``: a bfloat16 base, float32 adapters, products under autocast. The fused
    forward runs (every factor cast to bfloat16); its log-probabilities and adapter
    gradients are as close to float32's as peft's own bfloat16 pass is (bfloat16 rounds
    at 2^-8: on this small model both passes' gradients sit a few percent from float32's),
    and the gradients stay float32."""
    from ktae.train import lora_forward

    ids, mask, keep = _batch()
    calls = []
    fused_forward = lora_forward.fused_lora_forward
    monkeypatch.setattr(lora_forward, "fused_lora_forward",
                        lambda *a: calls.append(a[3]) or fused_forward(*a))

    def pass_(bf16: bool, fused: bool):
        model = _lora_llama()
        if bf16:
            for name, p in model.named_parameters():
                if "lora_" not in name:
                    p.data = p.data.to(torch.bfloat16)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            lp = (full_logps(model, ids, mask, keep, 0.7, compute_entropy=False,
                             entropy_grad=False)[0] if fused
                  else _autograd_logps(model, ids, mask, keep, 0.7)[0])
        (lp * mask[:, -keep:]).sum().backward()
        grads = [p.grad for p in model.parameters() if p.requires_grad]
        assert all(g.dtype == torch.float32 for g in grads)
        return lp.detach(), torch.cat([g.flatten() for g in grads])

    lp_ref, grad_ref = pass_(bf16=False, fused=False)
    lp_peft, grad_peft = pass_(bf16=True, fused=False)
    assert not calls
    lp_fused, grad_fused = pass_(bf16=True, fused=True)
    layers = sum(isinstance(m, peft.tuners.lora.Linear) for m in _lora_llama().modules())
    assert len(calls) == layers and set(calls) == {torch.bfloat16}
    assert lp_fused.dtype == torch.float32
    lp_err = {k: (lp - lp_ref).abs().max().item() for k, lp in
              (("peft", lp_peft), ("fused", lp_fused))}
    grad_err = {k: ((g - grad_ref).norm() / grad_ref.norm()).item() for k, g in
                (("peft", grad_peft), ("fused", grad_fused))}
    assert 0 < grad_err["peft"] < 0.1 and 0 < lp_err["peft"] < 0.1, (grad_err, lp_err)
    assert grad_err["fused"] < 1.5 * grad_err["peft"], grad_err
    assert lp_err["fused"] < 1.5 * lp_err["peft"], lp_err


def test_merged_lora_is_the_adapted_map_and_restores_every_weight():
    """Within ``merged_lora`` each plain LoRA layer runs its frozen layer with ``W +
    scaling B A``: the same log-probabilities as peft's forward (float32, within 1e-5),
    nested with the update's fused forward too; after it, every weight is the same tensor
    with the same values, and peft's adapters are on again."""
    from ktae.train.lora_forward import merged_lora

    model = _lora_llama()
    ids, mask, keep = _batch()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        plain, _ = _autograd_logps(model, ids, mask, keep, 1.0)
        with merged_lora(model) as count:
            assert count == 14  # 7 adapted layers in each of the 2 blocks
            merged, _ = _autograd_logps(model, ids, mask, keep, 1.0)
            nested, _ = full_logps(model, ids, mask, keep, 1.0, compute_entropy=False,
                                      entropy_grad=False)
            layer = model.base_model.model.model.layers[0].self_attn.q_proj
            assert layer.disable_adapters
    torch.testing.assert_close(merged, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nested, plain, rtol=1e-5, atol=1e-5)
    assert not layer.disable_adapters
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    with torch.no_grad():
        assert torch.equal(_autograd_logps(model, ids, mask, keep, 1.0)[0], plain)


def test_lora_for_sampling_merges_float32_and_fuses_bfloat16():
    from ktae.train.lora_forward import lora_for_sampling

    model = _lora_llama()
    with lora_for_sampling(model) as how:
        assert how == "merged"
    for module in model.modules():
        if isinstance(module, peft.tuners.lora.Linear):
            module.base_layer.weight.data = module.base_layer.weight.data.bfloat16()
    with lora_for_sampling(model) as how:
        assert how == "fused"
        layer = model.base_model.model.model.layers[0].mlp.up_proj
        assert "forward" in vars(layer)  # the fused forward, on the instance
    assert "forward" not in vars(layer)
    with model.disable_adapter(), lora_for_sampling(model) as how:
        assert how == "peft"  # no plain adapter active


def test_frozen_fused_lora_casts_once_and_matches_the_fused_forward(monkeypatch):
    """``fused_lora(frozen=True)`` (sampling): a bfloat16 base with float32 adapters under
    autocast gives the same logits as the fused forward that casts at every call, while
    each adapter's factors are cast once however many passes run (the second pass casts
    only what is not an adapter's); float32 without autocast gives peft's logits."""
    from ktae.train.lora_forward import fused_lora

    model = _lora_llama()
    for name, p in model.named_parameters():
        if "lora_" not in name:
            p.data = p.data.to(torch.bfloat16)
    ids, mask, _ = _batch()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        with fused_lora(model):
            every_call = model(input_ids=ids, attention_mask=mask).logits
        casts = []
        to = torch.Tensor.to
        monkeypatch.setattr(torch.Tensor, "to",
                            lambda self, *a, **k: casts.append(self.shape) or to(self, *a, **k))
        with fused_lora(model, frozen=True) as count:
            first = model(input_ids=ids, attention_mask=mask).logits
            after_one = len(casts)
            again = model(input_ids=ids, attention_mask=mask).logits
            after_two = len(casts)
        monkeypatch.undo()
    adapter_casts = 2 * count  # A and B of each layer, float32 -> bfloat16
    assert after_two - after_one <= after_one - adapter_casts
    torch.testing.assert_close(first, every_call, rtol=0, atol=1e-6)
    torch.testing.assert_close(again, first, rtol=0, atol=0)

    model32 = _lora_llama()
    with torch.no_grad():
        plain = model32(input_ids=ids, attention_mask=mask).logits
        with fused_lora(model32, frozen=True):
            frozen = model32(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(frozen, plain, rtol=1e-5, atol=1e-6)


def test_frozen_fused_lora_decodes_a_bfloat16_base_as_autocast_would(monkeypatch):
    """transformers' ``generate`` runs its decoding steps through the inner model's
    forward, outside the autocast the trainer's prefill runs in: there, a bfloat16 input
    over a bfloat16 base still takes the fused adapter in bfloat16 (never peft's forward,
    which would run the adapter in float32), and gives the logits autocast gives."""
    from ktae.train.lora_forward import fused_lora

    model = _lora_llama()
    for name, p in model.named_parameters():
        if "lora_" not in name:
            p.data = p.data.to(torch.bfloat16)
    ids, mask, _ = _batch()
    peft_calls = []
    forward = peft.tuners.lora.Linear.forward
    monkeypatch.setattr(peft.tuners.lora.Linear, "forward",
                        lambda self, *a, **k: peft_calls.append(1) or forward(self, *a, **k))
    with torch.no_grad(), fused_lora(model, frozen=True) as count:
        assert count > 0
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under = model(input_ids=ids, attention_mask=mask).logits
        outside = model(input_ids=ids, attention_mask=mask).logits
    assert peft_calls == []
    assert outside.dtype == torch.bfloat16
    torch.testing.assert_close(outside.float(), under.float(), rtol=0, atol=0)
