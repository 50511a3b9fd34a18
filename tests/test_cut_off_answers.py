"""An answer must end to count: a response cut at the token budget is never right, in the
rewards of ``ktae train``, its held-out evaluation, ``ktae eval`` (generated and recorded
responses) and the audit's right answer; ``cut_off="read"`` scores the text instead."""

from __future__ import annotations

import json

import pytest
import torch

from ktae.models.generate import Generation
from ktae.rewards.ends import counts_as_right, cut_at_budget, require_end
from ktae.rewards.registry import REWARDS, score_responses
from ktae.rewards.verify import RewardResult
from ktae.train.reward_funcs import make_accuracy_reward

# each reward's right answer to "7", in its own format, written where a cut could fall
RIGHT = {"boxed": "so \\boxed{7}", "dapo": "Answer: 7", "gsm8k": "#### 7",
         "number": "3 + 4 = 7", "digits": "\\boxed{7}"}


def test_require_end_scores_a_cut_off_response_wrong_and_keeps_what_was_read():
    right = RewardResult(1.0, True, True, "7")
    out = require_end([right, right], [True, False], wrong_score=-1.0)
    assert (out[0].correct, out[0].score, out[0].cut_off) == (False, -1.0, True)
    assert (out[0].formatted, out[0].extracted) == (True, "7")
    assert out[1] == right and not out[1].cut_off
    assert require_end([right], [True], rule="read") == [right]


@pytest.mark.parametrize("bad, match", [
    (dict(truncated=[True]), "truncated: expected 2 flags"),
    (dict(truncated=[True, False], rule="keep"), "rule: expected one of wrong, read"),
    (dict(truncated=[True, False], wrong_score=[0.0]), "wrong_score: expected 2 scores"),
])
def test_require_end_refuses_bad_input(bad, match):
    right = RewardResult(1.0, True, True, "7")
    with pytest.raises(ValueError, match=match):
        require_end([right, right], **bad)


def test_cut_at_budget_and_counts_as_right():
    stops = {0, 2}
    assert cut_at_budget([5, 6], stops) and not cut_at_budget([5, 2], stops)
    assert not cut_at_budget([], stops)  # an empty response holds no answer either way
    assert not counts_as_right(True, True) and counts_as_right(True, False)
    assert counts_as_right(True, True, "read") and not counts_as_right(False, False)


@pytest.mark.parametrize("name", sorted(RIGHT))
def test_every_reward_scores_a_cut_off_answer_as_its_wrong_answer(name):
    texts, answers = [RIGHT[name]] * 2, ["7"] * 2
    ended, cut = score_responses(name, texts, answers, truncated=[False, True], num_workers=1)
    wrong = score_responses(name, ["nothing"], ["7"], truncated=[False], num_workers=1)[0]
    assert ended.correct and not ended.cut_off
    assert not cut.correct and cut.cut_off and cut.score == wrong.score
    assert cut.score == REWARDS[name].wrong_score
    read = score_responses(name, texts, answers, truncated=[False, True], cut_off="read",
                           num_workers=1)
    assert [r.correct for r in read] == [True, True]


def test_auto_gives_each_row_its_own_rewards_wrong_score():
    texts = ["Answer: 7", "#### 7"]
    out = score_responses("auto", texts, ["7", "7"], truncated=[True, True], num_workers=1,
                          data_sources=["math_dapo", "openai/gsm8k"])
    assert [r.score for r in out] == [-1.0, 0.0] and not any(r.correct for r in out)


def test_the_trainers_accuracy_reward_reads_the_ids_for_the_end():
    accuracy = make_accuracy_reward(reward="number", stop_ids=[0])
    scores = accuracy(["3 + 4 = 7", "3 + 4 = 7"], ["7", "7"],
                      completion_ids=[[5, 6, 0], [5, 6, 7]])
    assert scores == [1.0, 0.0]
    reading = make_accuracy_reward(reward="number", cut_off="read")
    assert reading(["3 + 4 = 7"] * 2, ["7", "7"], completion_ids=[[5, 0], [5, 6]]) == [1.0, 1.0]
    unbound = make_accuracy_reward(reward="number")
    with pytest.raises(ValueError, match="stop_ids: the accuracy reward needs"):
        unbound(["7"], ["7"], completion_ids=[[5]])
    with pytest.raises(ValueError, match="cut_off_answers: expected one of wrong, read"):
        make_accuracy_reward(cut_off="maybe")


def test_greedy_accuracy_counts_a_cut_off_answer_wrong(monkeypatch):
    from ktae.train import evaluation

    def fake_generate(model, tokenizer, prompts, sampling, **_):
        return [[Generation("3 + 4 = 7", 5)], [Generation("so 7", 64, truncated=True)]]

    monkeypatch.setattr(evaluation, "generate_hf", fake_generate)
    rows = [{"prompt": "a", "answer": "7"}, {"prompt": "b", "answer": "7"}]
    report = evaluation.greedy_accuracy(None, None, rows, max_new_tokens=64, reward="number")
    assert report["accuracy"] == 0.5 and report["truncated"] == 0.5
    assert [p["correct"] for p in report["problems"]] == [True, False]
    assert report["problems"][1]["extracted"] == "7"
    read = evaluation.greedy_accuracy(None, None, rows, max_new_tokens=64, reward="number",
                                      cut_off="read")
    assert read["accuracy"] == 1.0


def test_ktae_eval_grades_recorded_cut_off_responses_wrong(tmp_path, capsys):
    from ktae.cli import main

    path = tmp_path / "responses.jsonl"
    rows = [{"benchmark": "gsm8k", "id": "1", "prompt": "p", "answer": "7",
             "response": "\\boxed{7}", "truncated": cut} for cut in (False, True)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    accuracies = {}
    for rule in ("wrong", "read"):
        out = tmp_path / rule
        assert main(["eval", "--responses", str(path), "--cut-off-answers", rule,
                     "--output-dir", str(out)]) == 0
        results = json.loads((out / "results.json").read_text())
        accuracies[rule] = results["benchmarks"]["gsm8k"]["accuracy"]
        assert results["config"]["cut_off_answers"] == rule
    capsys.readouterr()
    assert accuracies == {"wrong": 0.5, "read": 1.0}


def test_ktae_eval_generation_counts_a_cut_off_answer_wrong(monkeypatch, tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ktae.eval import runner
    from ktae.eval.benchmarks import BenchmarkRecord

    def fake_generate(model, tokenizer, prompts, sampling, **_):
        return [[Generation("\\boxed{7}", 3), Generation("\\boxed{7}", 8, truncated=True)]]

    monkeypatch.setattr(runner, "generate_hf", fake_generate)
    tok = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    recs = [BenchmarkRecord(id="1", problem="p", answer="7", source="custom")]
    res = runner.evaluate(model, tok, {"custom": recs}, k=2, temperature=0.7,
                          template="compact", max_new_tokens=8)
    assert res["benchmarks"]["custom"]["accuracy"] == 0.5
    assert res["config"]["cut_off_answers"] == "wrong"
    assert [r["correct"] for r in res["samples"]["custom"]] == [True, False]
    read = runner.evaluate(model, tok, {"custom": recs}, k=2, temperature=0.7,
                           template="compact", max_new_tokens=8, cut_off="read")
    assert read["benchmarks"]["custom"]["accuracy"] == 1.0


def test_the_audits_right_answer_must_end(monkeypatch):
    from ktae.credit_audit import arith_input

    class Tok:
        def __len__(self):
            return 49152

    def fake_generate(model, tokenizer, prompts, sampling, **_):
        gens = []
        for p in prompts:
            answer = arith_input.arith.problem_in(p).answer
            gens.append([Generation(f"The answer is {answer}", 5, (1, 2, 3)),
                         Generation(f"The answer is {answer}", 64, (1, 2, 4), truncated=True)])
        return gens

    monkeypatch.setattr(arith_input, "generate_hf", fake_generate)
    monkeypatch.setattr(arith_input, "chat_prompt", lambda tok, p: arith_input.user_message(p))
    monkeypatch.setattr(arith_input, "claims_labels", lambda tok, responses, answer, *_:
                        ["." * len(r) for r in responses])
    for rule, expected in (("wrong", [True, False]), ("read", [True, True])):
        data = arith_input.sampled_input(None, Tok(), "m", difficulty=0, prompts=2, samples=2,
                                         seed=0, max_new_tokens=64, temperature=0.6,
                                         cut_off=rule)
        assert [g.group.correct for g in data.groups] == [expected] * 2


def test_sampled_groups_for_explain_and_the_audit_must_end(monkeypatch):
    from ktae.groups import sampling

    def fake_generate(model, tokenizer, prompts, config, **_):
        return [[Generation("\\boxed{7}", 3, (1, 2, 0)),
                 Generation("\\boxed{7}", 8, (1, 2, 3), truncated=True)] for _ in prompts]

    monkeypatch.setattr(sampling, "generate_hf", fake_generate)
    rows = [{"prompt": "p", "answer": "7"}]
    (_, group), = sampling.sample_groups(None, None, rows, num_generations=2, max_new_tokens=8,
                                         temperature=1.0, seed=0)
    assert group.correct == [True, False] and group.rewards == [1.0, 0.0]
    (_, read), = sampling.sample_groups(None, None, rows, num_generations=2, max_new_tokens=8,
                                        temperature=1.0, seed=0, cut_off="read")
    assert read.correct == [True, True]


@pytest.mark.slow
def test_a_training_step_scores_every_cut_off_response_wrong(tmp_path):
    """One step of the shipped model under the ``number`` reward, with a budget that cuts
    about half its responses: a cut-off response never scores, though its last number is
    sometimes the answer (the rule ``read`` scores those)."""
    from test_train_helpers import Recorder, tiny_config

    from ktae.models.warmstart import default_model_path
    from ktae.train.session import train

    records = {}
    for rule in ("wrong", "read"):
        seen: list = []
        cls = type("R", (Recorder,), {"seen": seen})
        cfg = tiny_config(default_model_path(), tmp_path / rule, algo="grpo", credit="ktae",
                          reward="number", max_steps=1, max_new_tokens=24, num_prompts=8,
                          temperature=1.5, seed=3, cut_off_answers=rule)
        train(cfg, trainer_cls=cls)
        records[rule] = seen[0]
    wrong, read = records["wrong"], records["read"]
    assert torch.equal(wrong["ids"], read["ids"])  # the same samples
    mask = wrong["token_mask"].bool()
    lengths = mask.sum(1)
    last = wrong["ids"].gather(1, (lengths - 1).clamp_min(0)[:, None]).squeeze(1)
    cut = (lengths > 0) & ~torch.isin(last, torch.tensor(wrong["ignore"]))
    assert cut.any() and (~cut).any()
    assert not wrong["correct"][cut].any()
    assert torch.equal(wrong["correct"][~cut], read["correct"][~cut])
    # a cut-off response whose last number is the answer: right under "read" only
    assert (read["correct"] & cut).any()


def test_train_settings_are_checked():
    from ktae.runs.config import TrainConfig

    with pytest.raises(ValueError, match="cut_off_answers: expected one of wrong, read"):
        TrainConfig(cut_off_answers="skip").resolve()
    with pytest.raises(ValueError, match="eval_split: expected test or eval"):
        TrainConfig(task="arith@difficulty=0", eval_split="train").resolve()
    with pytest.raises(ValueError, match="eval_split: the embedded task has one held-out set"):
        TrainConfig(eval_split="eval").resolve()


def test_eval_split_holds_the_arith_eval_computations_out_of_test():
    from ktae.tasks import arith
    from ktae.train.data import read_task

    test = read_task("arith@difficulty=0", train_size=8, eval_size=200, seed=0)
    tuning = read_task("arith@difficulty=0", train_size=8, eval_size=200, seed=0,
                       eval_split="eval")
    assert [e.id for e in tuning.train] == [e.id for e in test.train]
    splits = {arith.split_of(*_kind_and_operands(e.problem)) for e in tuning.eval}
    assert splits == {"eval"} and len(tuning.eval) == 200
    assert {_kind_and_operands(e.problem) for e in tuning.eval}.isdisjoint(
        {_kind_and_operands(e.problem) for e in test.eval})


def _kind_and_operands(question: str) -> tuple:
    from ktae.tasks import arith

    p = arith.problem_in(question)
    return p.kind, arith.canonical(p.kind, p.operands)


def test_the_audit_command_passes_its_cut_off_rule(monkeypatch, capsys, tmp_path):
    from ktae.cli import main
    from ktae.credit_audit import cli

    seen = {}

    def fake_audit(*args, **kwargs):
        seen.update(kwargs)
        raise ValueError("stop here")

    monkeypatch.setattr(cli, "audit", fake_audit)
    assert main(["audit", "--model", "default", "--cut-off-answers", "read",
                 "-o", str(tmp_path / "a")]) == 2
    assert seen["cut_off"] == "read" and "stop here" in capsys.readouterr().err


def test_a_training_mix_is_followed_however_few_computations_a_kind_has():
    from collections import Counter

    from ktae.tasks import arith

    level = arith.generate(2000, split="train", seed=0, difficulty=0)
    mix = arith.parse_mix("add=0.555,sub=0.335,mul=0.11")
    drawn = arith.generate(2000, split="train", seed=0, difficulty=0, mix=mix)
    share = {k: v / 2000 for k, v in Counter(p.kind for p in drawn).items()}
    for kind, weight in mix.items():
        if weight:
            assert abs(share[kind] - weight) < 0.04, (kind, share)
    # level 0's few products are drawn far below their weight of 0.5 without a mix
    assert Counter(p.kind for p in level)["mul"] / 2000 < 0.3
    assert all(arith.split_of(p.kind, p.operands) == "train" for p in drawn)


@pytest.mark.parametrize("text, match", [
    ("add=1,times=2", "task_mix: expected KIND=WEIGHT"),
    ("add=-1", "task_mix: expected KIND=WEIGHT"),
    ("add=1,add=2", "task_mix: expected KIND=WEIGHT"),
    ("add=0,sub=0", "task_mix: expected a positive weight"),
    ("add", "task_mix: expected KIND=WEIGHT"),
])
def test_bad_mixes_are_refused(text, match):
    from ktae.tasks import arith

    with pytest.raises(ValueError, match=match):
        arith.parse_mix(text)


def test_a_mix_goes_with_the_arith_task_and_weighs_every_kind():
    from ktae.runs.config import TrainConfig
    from ktae.tasks import arith

    with pytest.raises(ValueError, match="mix: expected a weight for each of"):
        arith.generate(5, split="train", difficulty=0, mix={"add": 1.0})
    with pytest.raises(ValueError, match="task_mix: goes with --task arith"):
        TrainConfig(task_mix="add=1").resolve()
