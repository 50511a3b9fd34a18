# Copyright 2024 Bytedance Ltd. and/or its affiliates
# Copyright 2023-2024 SGLang Team
# Copyright 2025 ModelBest Inc. and/or its affiliates
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ruff: noqa: E501  (the authors' lines, kept as written)
"""The DelTA authors' weighting, for parity tests (docs/method.md §19).

Copied from the authors' released verl fork (Apache License 2.0, header above),
github.com/RUCBM/DelTA at commit cf048bd11f72f12f2feaea84e2b8d328fdd6fdda,
``verl-DelTA/verl/workers/actor/dp_actor.py``: the ``version == 'Normal'`` branch of
``DataParallelPPOActor.compute_log_prob_h``.

Changes, all outside the arithmetic: the model's no-grad pass of each micro-batch
(``self._forward_micro_batch_with_h``) is replaced by the micro-batch's given ``log_probs``
and ``h``; ``micro_batch.batch[...]`` reads are dict reads, the response's attention mask
given directly as ``attention_mask``; the config reads are arguments; device moves, the
dynamic-batch restore, entropies and unused counters are left out.
"""

from __future__ import annotations

import torch


def compute_log_prob_h_normal(micro_batches, K=1, lam_min=0.8, lam_max=1.2):
    """``(W, b, preds, weights, weighted_advantages)`` as the authors' function returns
    them; each micro-batch a dict of ``log_probs [B, S]``, ``h [B, S, H]``,
    ``attention_mask [B, S]`` (the response part) and ``advantages [B, S]``."""
    lam = 1e-6
    eps = 1e-8
    disc_steps = K
    final_w_lo = lam_min
    final_w_hi = lam_max
    gamma_time = 1

    lam_w = 1.0

    pred_lst = []
    weight_lst = []
    weighted_adv_lst = []

    sum_v_pos = None
    sum_v_neg = None
    sum_v2_pos = None
    sum_v2_neg = None
    S_p = None
    S_n = None

    for micro_batch in micro_batches:
        with torch.no_grad():
            log_probs, h = micro_batch["log_probs"], micro_batch["h"]

            leng = log_probs.shape[-1]
            token_mask = micro_batch["attention_mask"][:, -leng:].float()   # [B,S]
            adv = micro_batch["advantages"][:, 0].float()                   # [B]

            probs = torch.exp(log_probs)                                          # [B,S]
            v = (1.0 - probs).unsqueeze(-1) * h                                   # [B,S,H]
            v2 = v ** 2
            token_mask_3d = token_mask.unsqueeze(-1)                              # [B,S,1]

            adv_pos = torch.clamp(adv, min=0.0)
            adv_neg = torch.clamp(-adv, min=0.0)

            w_pos0 = adv_pos[:, None, None] * token_mask_3d
            w_neg0 = adv_neg[:, None, None] * token_mask_3d

            if S_p is None:
                hidden_dim = h.shape[-1]
                device = h.device
                dtype = h.dtype

                sum_v_pos = torch.zeros(hidden_dim, device=device, dtype=dtype)
                sum_v_neg = torch.zeros(hidden_dim, device=device, dtype=dtype)
                sum_v2_pos = torch.zeros(hidden_dim, device=device, dtype=dtype)
                sum_v2_neg = torch.zeros(hidden_dim, device=device, dtype=dtype)
                S_p = torch.zeros((), device=device, dtype=dtype)
                S_n = torch.zeros((), device=device, dtype=dtype)

            sum_v_pos = sum_v_pos + (w_pos0 * v).sum(dim=(0, 1))
            sum_v_neg = sum_v_neg + (w_neg0 * v).sum(dim=(0, 1))
            sum_v2_pos = sum_v2_pos + (w_pos0 * v2).sum(dim=(0, 1))
            sum_v2_neg = sum_v2_neg + (w_neg0 * v2).sum(dim=(0, 1))
            S_p = S_p + w_pos0.sum()
            S_n = S_n + w_neg0.sum()

    S_p = torch.clamp(S_p, min=eps)
    S_n = torch.clamp(S_n, min=eps)

    mu_pos = sum_v_pos / S_p
    mu_neg = sum_v_neg / S_n

    sig_pos = sum_v2_pos / S_p - mu_pos ** 2
    sig_neg = sum_v2_neg / S_n - mu_neg ** 2
    sig_pos = torch.clamp(sig_pos, min=0.0)
    sig_neg = torch.clamp(sig_neg, min=0.0)

    d = sig_pos + sig_neg + lam   # [H]
    d = torch.ones_like(mu_pos)

    m_pos_sumsq, m_pos_sum, m_pos_count = 0.0, 0.0, 0.0
    m_neg_sumsq, m_neg_sum, m_neg_count = 0.0, 0.0, 0.0

    for micro_batch in micro_batches:
        with torch.no_grad():
            log_probs, h = micro_batch["log_probs"], micro_batch["h"]

            leng = log_probs.shape[-1]
            token_mask = micro_batch["attention_mask"][:, -leng:].float()
            adv = micro_batch["advantages"][:, 0].float()

            probs = torch.exp(log_probs)
            v = (1.0 - probs).unsqueeze(-1) * h

            diff_pos = v - mu_pos.view(1, 1, -1)
            diff_neg = v - mu_neg.view(1, 1, -1)

            d_pos = ((diff_pos ** 2) / d.view(1, 1, -1)).sum(dim=-1)
            d_neg = ((diff_neg ** 2) / d.view(1, 1, -1)).sum(dim=-1)

            pos_seq_mask = (adv > 0).float().unsqueeze(1)
            neg_seq_mask = (adv < 0).float().unsqueeze(1)

            valid_pos_mask = pos_seq_mask * token_mask
            valid_neg_mask = neg_seq_mask * token_mask

            margin_pos = lam_w * d_neg - d_pos
            margin_neg = lam_w * d_pos - d_neg

            if isinstance(m_pos_sumsq, float):
                device = mu_pos.device
                dtype = mu_pos.dtype
                m_pos_sumsq = torch.zeros((), device=device, dtype=dtype)
                m_pos_sum = torch.zeros((), device=device, dtype=dtype)
                m_pos_count = torch.zeros((), device=device, dtype=dtype)
                m_neg_sumsq = torch.zeros((), device=device, dtype=dtype)
                m_neg_sum = torch.zeros((), device=device, dtype=dtype)
                m_neg_count = torch.zeros((), device=device, dtype=dtype)

            m_pos_sum += (margin_pos * valid_pos_mask).sum()
            m_pos_sumsq += (margin_pos ** 2 * valid_pos_mask).sum()
            m_pos_count += valid_pos_mask.sum()

            m_neg_sum += (margin_neg * valid_neg_mask).sum()
            m_neg_sumsq += (margin_neg ** 2 * valid_neg_mask).sum()
            m_neg_count += valid_neg_mask.sum()

    m_pos_count = torch.clamp(m_pos_count, min=1.0)
    m_pos_mean = m_pos_sum / m_pos_count
    gamma_pos = gamma_time*torch.sqrt(torch.clamp(m_pos_sumsq / m_pos_count - m_pos_mean ** 2, min=eps))

    m_neg_count = torch.clamp(m_neg_count, min=1.0)
    m_neg_mean = m_neg_sum / m_neg_count
    gamma_neg = gamma_time*torch.sqrt(torch.clamp(m_neg_sumsq / m_neg_count - m_neg_mean ** 2, min=eps))

    mu_pos_star = mu_pos.clone()
    mu_neg_star = mu_neg.clone()

    for _ in range(disc_steps):
        num_pos = torch.zeros_like(mu_pos_star)
        num_neg = torch.zeros_like(mu_neg_star)
        den_pos = torch.zeros((), device=mu_pos_star.device, dtype=mu_pos_star.dtype)
        den_neg = torch.zeros((), device=mu_neg_star.device, dtype=mu_neg_star.dtype)

        next_m_pos_sumsq, next_m_pos_sum, next_m_pos_count = 0.0, 0.0, 0.0
        next_m_neg_sumsq, next_m_neg_sum, next_m_neg_count = 0.0, 0.0, 0.0

        for micro_batch in micro_batches:
            with torch.no_grad():
                log_probs, h = micro_batch["log_probs"], micro_batch["h"]

                leng = log_probs.shape[-1]
                token_mask = micro_batch["attention_mask"][:, -leng:].float()
                adv = micro_batch["advantages"][:, 0].float()

                probs = torch.exp(log_probs)
                v = (1.0 - probs).unsqueeze(-1) * h

                diff_pos = v - mu_pos_star.view(1, 1, -1)
                diff_neg = v - mu_neg_star.view(1, 1, -1)

                d_pos = ((diff_pos ** 2) / d.view(1, 1, -1)).sum(dim=-1)
                d_neg = ((diff_neg ** 2) / d.view(1, 1, -1)).sum(dim=-1)

                pos_seq_mask = (adv > 0).float().unsqueeze(1)
                neg_seq_mask = (adv < 0).float().unsqueeze(1)

                valid_pos_mask = pos_seq_mask * token_mask
                valid_neg_mask = neg_seq_mask * token_mask

                margin_pos = lam_w * d_neg - d_pos
                margin_neg = lam_w * d_pos - d_neg

                # Sigmoid posterior probability mapping
                raw_w_pos = torch.sigmoid(margin_pos / gamma_pos)
                raw_w_neg = torch.sigmoid(margin_neg / gamma_neg)

                base_pos = torch.clamp(adv, min=0.0).unsqueeze(1)
                base_neg = torch.clamp(-adv, min=0.0).unsqueeze(1)

                w_pos = raw_w_pos * base_pos * valid_pos_mask
                w_neg = raw_w_neg * base_neg * valid_neg_mask

                num_pos += (w_pos.unsqueeze(-1) * v).sum(dim=(0, 1))
                num_neg += (w_neg.unsqueeze(-1) * v).sum(dim=(0, 1))
                den_pos += w_pos.sum()
                den_neg += w_neg.sum()

                if isinstance(next_m_pos_sumsq, float):
                    device = mu_pos_star.device
                    dtype = mu_pos_star.dtype
                    next_m_pos_sumsq = torch.zeros((), device=device, dtype=dtype)
                    next_m_pos_sum = torch.zeros((), device=device, dtype=dtype)
                    next_m_pos_count = torch.zeros((), device=device, dtype=dtype)
                    next_m_neg_sumsq = torch.zeros((), device=device, dtype=dtype)
                    next_m_neg_sum = torch.zeros((), device=device, dtype=dtype)
                    next_m_neg_count = torch.zeros((), device=device, dtype=dtype)

                next_m_pos_sum += (margin_pos * valid_pos_mask).sum()
                next_m_pos_sumsq += (margin_pos ** 2 * valid_pos_mask).sum()
                next_m_pos_count += valid_pos_mask.sum()

                next_m_neg_sum += (margin_neg * valid_neg_mask).sum()
                next_m_neg_sumsq += (margin_neg ** 2 * valid_neg_mask).sum()
                next_m_neg_count += valid_neg_mask.sum()

        den_pos = torch.clamp(den_pos, min=eps)
        den_neg = torch.clamp(den_neg, min=eps)

        mu_pos_star = num_pos / den_pos
        mu_neg_star = num_neg / den_neg

        next_m_pos_count = torch.clamp(next_m_pos_count, min=1.0)
        next_m_pos_mean = next_m_pos_sum / next_m_pos_count
        gamma_pos = gamma_time*torch.sqrt(torch.clamp(next_m_pos_sumsq / next_m_pos_count - next_m_pos_mean ** 2, min=eps))

        next_m_neg_count = torch.clamp(next_m_neg_count, min=1.0)
        next_m_neg_mean = next_m_neg_sum / next_m_neg_count
        gamma_neg = gamma_time*torch.sqrt(torch.clamp(next_m_neg_sumsq / next_m_neg_count - next_m_neg_mean ** 2, min=eps))

    W = (mu_pos_star - mu_neg_star) / d
    b = -0.5 * ((mu_pos_star ** 2 - mu_neg_star ** 2) / d).sum()

    tk_sum = torch.zeros((), device=W.device, dtype=W.dtype)
    wht_sum = torch.zeros((), device=W.device, dtype=W.dtype)

    for micro_batch in micro_batches:
        with torch.no_grad():
            log_probs, h = micro_batch["log_probs"], micro_batch["h"]

            leng = log_probs.shape[-1]
            token_mask = micro_batch["attention_mask"][:, -leng:].float()
            adv = micro_batch["advantages"][:, 0].float()

            probs = torch.exp(log_probs)
            v = (1.0 - probs).unsqueeze(-1) * h

            score = (v * W.view(1, 1, -1)).sum(dim=-1) + b
            y = torch.sign(adv).unsqueeze(1)
            pred = y * score * token_mask

            diff_pos = v - mu_pos_star.view(1, 1, -1)
            diff_neg = v - mu_neg_star.view(1, 1, -1)

            d_pos = ((diff_pos ** 2) / d.view(1, 1, -1)).sum(dim=-1)
            d_neg = ((diff_neg ** 2) / d.view(1, 1, -1)).sum(dim=-1)

            margin_pos = lam_w * d_neg - d_pos
            margin_neg = lam_w * d_pos - d_neg

            w_pos_strict = torch.sigmoid(margin_pos / gamma_pos)
            w_neg_strict = torch.sigmoid(margin_neg / gamma_neg)

            w_pos_final = final_w_lo + (final_w_hi - final_w_lo) * w_pos_strict
            w_neg_final = final_w_lo + (final_w_hi - final_w_lo) * w_neg_strict

            pos_seq_mask = (adv > 0).float().unsqueeze(1)
            neg_seq_mask = (adv < 0).float().unsqueeze(1)

            zero_seq_mask = 1.0 - pos_seq_mask - neg_seq_mask

            weight = (w_pos_final * pos_seq_mask + w_neg_final * neg_seq_mask + final_w_lo * zero_seq_mask) * token_mask

            tk_sum += token_mask.sum()
            wht_sum += weight.sum()

            weighted_adv = adv.unsqueeze(1) * weight * token_mask

        pred_lst.append(pred)
        weight_lst.append(weight)
        weighted_adv_lst.append(weighted_adv)

    preds = torch.concat(pred_lst, dim=0)
    weights = torch.concat(weight_lst, dim=0)
    weighted_advantages = torch.concat(weighted_adv_lst, dim=0)

    gy_norm = tk_sum / wht_sum.clamp_min(1e-8)
    weights *= gy_norm
    weighted_advantages *= gy_norm

    return W, b, preds, weights, weighted_advantages
