"""The rollout file of a run: which steps and groups are kept, calibration rows found in
shuffled micro-batches, append-only writes that survive a kill, resume truncation."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from ktae.runs.credit import CreditSettings
from ktae.runs.rollouts import RolloutRecorder, is_recorded_step, read_rollouts


class _Tok:
    name_or_path = "tok"

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i) for i in ids if not (skip_special_tokens and i == 0))


def _trainer(step=0, calibration=None, main=True, training=True, G=2):
    return SimpleNamespace(
        credit=CreditSettings(estimator="ktae", estimator_options={"base": "grpo"},
                              calibration=calibration),
        _tokenizer=_Tok(), processing_class=_Tok(), ignore_token_ids=[0],
        num_generations=G, state=SimpleNamespace(global_step=step),
        model=SimpleNamespace(training=training),
        accelerator=SimpleNamespace(is_main_process=main))


def _batch(B=6, T=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 9, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 3:] = 0
    mask[4, 2:] = 0
    prompt = torch.randint(1, 9, (B, 3), generator=g)
    prompt[:, 0] = 0  # left padding
    batch = {"prompt_ids": prompt, "prompt_mask": (prompt != 0).long(), "completion_ids": ids,
             "completion_mask": mask}
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 1.0])[:B]
    adv = torch.randn(B, T, generator=g) * mask
    return batch, rewards, adv


def _record(rec, trainer, batch, rewards, adv):
    rec.on_advantages(trainer, batch=batch, ids=batch["completion_ids"],
                      mask=batch["completion_mask"], rewards=rewards, correct=rewards > 0,
                      advantages=adv)


def test_recorded_steps():
    assert [s for s in range(1, 12) if is_recorded_step(s, 5)] == [1, 6, 11]
    assert not any(is_recorded_step(s, 0) for s in range(1, 5))
    with pytest.raises(ValueError, match="^every:"):
        RolloutRecorder("x", every=-1, groups=1)


def test_groups_of_recorded_steps_only_on_the_main_process(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    rec = RolloutRecorder(path, every=2, groups=2)
    batch, rewards, adv = _batch()
    for step in range(4):  # trains steps 1..4: 1 and 3 are recorded
        _record(rec, _trainer(step), batch, rewards, adv)
    _record(rec, _trainer(0, main=False), batch, rewards, adv)
    _record(rec, _trainer(0, training=False), batch, rewards, adv)
    header, records = read_rollouts(path)
    assert header["estimator"] == "ktae" and header["ignore_token_ids"] == [0]
    assert [(r["step"], r["group"]) for r in records] == [(1, 0), (1, 1), (3, 0), (3, 1)]
    first = records[0]
    assert first["prompt"] == "".join(chr(ord("a") + i) for i in batch["prompt_ids"][0, 1:])
    assert first["responses"][1] == batch["completion_ids"][1, :3].tolist()
    assert first["advantages"][1] == pytest.approx(adv[1, :3].tolist(), rel=1e-5)
    assert first["rewards"] == [1.0, 0.0] and first["correct"] == [True, False]
    assert "weights" not in first


def test_calibration_rows_are_found_in_shuffled_micro_batches(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    rec = RolloutRecorder(path, every=1, groups=2)
    trainer = _trainer(0, calibration="taco")
    batch, rewards, adv = _batch()
    _record(rec, trainer, batch, rewards, adv)
    assert read_rollouts(path)[1] == []  # waits for the calibration
    B, T = adv.shape
    g = torch.Generator().manual_seed(0)
    logp = -torch.rand(B, T, generator=g)
    ent = torch.rand(B, T, generator=g)
    weights = torch.where(torch.rand(B, T, generator=g) > 0.5, 0.1, 1.0)
    kept = torch.rand(B, T, generator=g) > 0.3
    kept[:, 0] = False  # every response has a token out of the loss: loss_mask is recorded
    perm = torch.tensor([5, 2, 0, 4, 1, 3])  # TRL shuffles rows and splits them
    for part in (perm[:3], perm[3:]):
        inputs = {k: v[part] for k, v in batch.items()}
        result = SimpleNamespace(weights=weights[part], flagged=weights[part] < 1,
                                 loss_mask=kept[part])
        rec.on_calibration(trainer, inputs=inputs, logprobs=logp[part], entropies=ent[part],
                           result=result)
    _, records = read_rollouts(path)
    assert len(records) == 2
    for g, r in enumerate(records):
        for j in range(2):
            row = 2 * g + j
            m = batch["completion_mask"][row].bool()
            assert r["logprobs"][j] == pytest.approx(logp[row][m].tolist(), rel=1e-5)
            assert r["entropies"][j] == pytest.approx(ent[row][m].tolist(), rel=1e-5)
            assert r["weights"][j] == pytest.approx(weights[row][m].tolist())
            assert r["flagged"][j] == (weights[row][m] < 1).int().tolist()
            assert r["loss_mask"][j] == kept[row][m].int().tolist()
            assert len(r["logprobs"][j]) == len(r["responses"][j])


def test_rows_left_out_of_the_loss(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    rec = RolloutRecorder(path, every=1, groups=2)
    batch, rewards, adv = _batch()
    loss_mask = batch["completion_mask"].clone()
    loss_mask[2] = 0  # e.g. a truncated response the trainer masks out
    rec.on_advantages(_trainer(0), batch=batch, ids=batch["completion_ids"],
                      mask=batch["completion_mask"], rewards=rewards, correct=rewards > 0,
                      advantages=adv, loss_mask=loss_mask)
    rec.on_advantages(_trainer(1), batch=batch, ids=batch["completion_ids"],
                      mask=batch["completion_mask"], rewards=rewards, correct=rewards > 0,
                      advantages=adv, loss_mask=batch["completion_mask"])
    _, records = read_rollouts(path)
    assert "loss_mask" not in records[0]  # group 0: every token in the loss
    assert records[1]["loss_mask"] == [[0, 0, 0, 0], [1, 1, 1, 1]]
    assert all("loss_mask" not in r for r in records[2:])  # step 2: nothing left out


def test_unscored_rows_are_written_as_null_at_the_next_step(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    rec = RolloutRecorder(path, every=1, groups=1)
    batch, rewards, adv = _batch()
    _record(rec, _trainer(0, calibration="taco"), batch, rewards, adv)
    rec.close()
    _, records = read_rollouts(path)
    assert records[0]["weights"] == [None, None] and "loss_mask" not in records[0]


def test_cut_last_line_repeats_and_resume_truncation(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    rec = RolloutRecorder(path, every=1, groups=1)
    batch, rewards, adv = _batch()
    for step in range(3):
        _record(rec, _trainer(step), batch, rewards, adv)
    text = path.read_text()
    path.write_text(text + text.splitlines()[-1][:25])  # a kill mid-write
    assert [r["step"] for r in read_rollouts(path)[1]] == [1, 2, 3]
    # a resumed run from step 1 drops later records (and the cut line) first
    RolloutRecorder(path, every=1, groups=1, keep_until_step=1)
    lines = path.read_text().splitlines()
    assert [json.loads(ln).get("step") for ln in lines] == [None, 1]
    # then re-records step 2: the last copy of a (step, group) wins
    rec2 = RolloutRecorder(path, every=1, groups=1, keep_until_step=1)
    _record(rec2, _trainer(1), batch, rewards * 0, adv)
    _, records = read_rollouts(path)
    assert [r["step"] for r in records] == [1, 2] and records[1]["rewards"] == [0.0, 0.0]
    path.write_text("not json\n" + path.read_text())
    with pytest.raises(ValueError, match="line 1 is not JSON"):
        read_rollouts(path)
