"""``ktae audit`` on a real chat model: the arith task, SmolLM2-135M-Instruct's real
tokenizer (the shipped fixture), labels from the claims labeller, the first line and the
progress lines, the 64-token budget, the right-answer-wrong-tokens rate, arith run
directories; tiny random weights where the weights do not matter. The end-to-end run on
the converted model is marked ``slow``; it also checks the sanity rules and the credit by
kind of token on the real model's groups (:mod:`ktae.credit_audit.sanity`,
:mod:`ktae.credit_audit.token_kinds`)."""

from __future__ import annotations

import json
import os
import time

import pytest
import torch
from test_viz_bpe import smollm2_tokenizer

from ktae.cli import main
from ktae.credit_audit import arith_input
from ktae.credit_audit.run import (
    AuditGroup,
    audit,
    audit_groups,
    parse_methods,
    right_answer_wrong_tokens,
)
from ktae.groups.input import GroupInput
from ktae.rewards.answer_line import number_check
from ktae.tasks import arith
from ktae.tasks.claims import claim_token_labels


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return smollm2_tokenizer(tmp_path_factory.mktemp("smollm2"))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tok):
    """Random weights of one small layer with SmolLM2's tokenizer and chat template."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, tie_word_embeddings=True))
    path = tmp_path_factory.mktemp("tiny-smollm2")
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def encode(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


# --------------------------------------------------------------------------- sampling


def test_sampled_groups_are_eval_problems_in_the_chat_template_with_claim_labels(tiny_dir):
    from ktae.groups.sampling import load_model

    model, tok, where = load_model(str(tiny_dir))
    calls = []
    data = arith_input.sampled_input(model, tok, where, difficulty=3, prompts=3, samples=2,
                                     seed=0, max_new_tokens=64, temperature=0.7,
                                     on_batch=calls.append)
    problems = arith.generate(3, split="eval", seed=arith.EVAL_SEED, difficulty=3)
    assert all(arith.split_of(p.kind, p.operands) == "eval" for p in problems)
    assert sum(calls) == 3 and len(calls) == 1  # 6 sequences: one batch of 32
    for g, p in zip(data.groups, problems, strict=True):
        assert g.group.prompt == tok.apply_chat_template(
            [{"role": "user", "content": f"{p.question} {arith.INSTRUCTION}"}],
            tokenize=False, add_generation_prompt=True)
        assert g.level == p.kind and g.group.answer == p.answer
        for ids, labels, c in zip(g.group.responses, g.labels, g.group.correct, strict=True):
            cut = ids[-1] != tok.eos_token_id  # no end of turn: the budget stopped it
            assert labels == "".join(claim_token_labels(tok, ids, p.answer, cut_off=cut))
            assert c == number_check(tok.decode(ids, skip_special_tokens=True), p.answer)[0]
    # random weights rarely stop: the budget is what cuts the responses
    assert max(len(r) for g in data.groups for r in g.group.responses) == 64
    assert "difficulty 3" in data.description and "eval split" in data.description


def test_prompt_sets_are_disjoint_and_follow_the_difficulty():
    a = arith_input.prompt_set_problems(20, 0, 2)
    b = arith_input.prompt_set_problems(20, 1, 2)
    assert {(p.kind, p.operands) for p in a}.isdisjoint({(p.kind, p.operands) for p in b})
    assert a == arith_input.prompt_set_problems(40, 0, 2)[:20]  # a prefix of one stream
    hard = arith_input.prompt_set_problems(20, 0, 3)
    assert max(max(p.operands) for p in hard) > max(max(p.operands) for p in a)
    assert all(p.operands[0] >= 20 for p in hard if p.kind != "mul")


def test_repeats_are_counted_once_the_small_split_runs_out():
    def repeats(prompts, prompt_set, difficulty):
        stream = arith_input.prompt_set_problems((prompt_set + 1) * prompts, 0, difficulty)
        return arith_input.repeated_problems(stream, prompts)

    assert repeats(16, 0, 1) == 0 and repeats(20, 1, 2) == 0
    # the eval split holds 115 distinct level-1 problems: the first six sets of 16 are
    # distinct, the seventh repeats 8 earlier problems, the eighth 15
    assert repeats(16, 5, 1) == 0 and repeats(16, 6, 1) == 8 and repeats(16, 7, 1) == 15


def test_problem_in_reads_every_kind_back_from_a_decoded_chat_prompt(tok):
    for d in (1, 2, 3):
        for p in arith.generate(60, split="train", seed=3, difficulty=d):
            ids = encode(tok, arith_input.chat_prompt(tok, p))
            found = arith.problem_in(tok.decode(ids, skip_special_tokens=True))
            assert (found.question, found.answer, found.kind, found.operands) == (
                p.question, p.answer, p.kind, p.operands)
    assert arith.problem_in("Mia has 14 pencils. How many?") is None


# --------------------------------------------------------------------------- the figures


RIGHT_SLIP = "3 + 4 = 8 apples. Then 8 - 1 = 7. The answer is 7."
RIGHT_CLEAN = "3 + 4 = 7. The answer is 7."
WRONG = "3 + 4 = 7. The answer is 6."


def hand_group(tok) -> AuditGroup:
    responses = [encode(tok, t) for t in (RIGHT_SLIP, RIGHT_CLEAN, WRONG)]
    g = GroupInput(prompt="p", responses=responses, rewards=[1.0, 1.0, 0.0],
                   correct=[True, True, False], label="hand")
    return AuditGroup(g, arith_input.claims_labels(tok, responses, "7"), level="add", key="0")


def test_contamination_is_the_positive_credit_on_a_right_answers_false_claim(tok):
    group = hand_group(tok)
    slip = group.labels[0]
    pieces = [tok.decode([i]) for i in group.group.responses[0]]
    assert [p for p, c in zip(pieces, slip, strict=True) if c == "w"] == ["8"]  # "= 8": false
    result = audit_groups([group], parse_methods("grpo,ktae"), resamples=0)
    # GRPO gives every token of a right answer the same positive credit: the share on the
    # false claim's result is its token count over the response's token count
    grpo = result["methods"]["grpo"]["all"]
    assert grpo["contamination"]["mean"] == pytest.approx(slip.count("w") / len(slip))
    assert grpo["contamination"]["responses"] == 1  # the clean right answer has no wrong token
    assert grpo["contamination_vs_grpo"]["mean"] == 0
    rate = right_answer_wrong_tokens([group], resamples=0)
    assert rate["all"]["mean"] == 0.5 and rate["all"]["responses"] == 2


def test_the_rate_counts_every_right_answer_and_splits_by_step(tok):
    base = hand_group(tok)
    twice = [base.group.responses[1]] * 2
    clean = AuditGroup(GroupInput(prompt="p", responses=twice, rewards=[1.0, 1.0],
                                  correct=[True, True], label="c"),
                       [base.labels[1]] * 2, step=5, key="1")
    early = AuditGroup(base.group, base.labels, step=1, key="0")
    rate = right_answer_wrong_tokens([early, clean], resamples=200)
    # 4 right answers (2 in a group of right answers only), 1 with a false claim
    assert rate["all"]["mean"] == 0.25 and rate["all"]["responses"] == 4
    assert rate["steps"]["1"]["mean"] == 0.5 and rate["steps"]["5"]["mean"] == 0.0
    assert 0 <= rate["all"]["low"] <= 0.25 <= rate["all"]["high"] <= 0.5


# --------------------------------------------------------------------------- a run directory


def write_arith_run(path, tok, *, steps=(1, 3), texts=None, eos=True) -> list:
    """A run directory of the arith task: recorded groups whose prompts are decoded chat
    prompts (as the trainer records them) and whose responses are hand-written
    (``texts(answer)``), each ending with the end-of-turn token when ``eos`` (as the
    trainer records a response that stopped) and without it otherwise (cut at the budget)."""
    path.mkdir()
    problems = arith.generate(len(steps), split="train", seed=0, difficulty=1)
    lines = [{"kind": "header", "format": "ktae-rollouts", "version": 1, "estimator": "grpo",
              "estimator_options": {}, "calibration": None, "calibration_options": {},
              "ignore_token_ids": [tok.eos_token_id], "num_generations": 3}]
    for step, p in zip(steps, problems, strict=True):
        a = int(p.answer)
        written = texts(a) if texts else [f"{a - 1} + 1 = {a + 1}. The answer is {a}.",
                                          f"The answer is {a}.",
                                          f"{a} + 1 = {a + 1}. The answer is {a + 1}."]
        prompt = tok.decode(encode(tok, arith_input.chat_prompt(tok, p)), skip_special_tokens=True)
        end = [tok.eos_token_id] if eos else []
        lines.append({"kind": "group", "step": step, "group": 0, "prompt": prompt,
                      "responses": [encode(tok, t) + end for t in written], "rewards": [1, 1, 0],
                      "correct": [True, True, False]})
    (path / "rollouts.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (path / "config.yaml").write_text(f"model: {path.parent / 'model'}\ntask: arith@difficulty=1\n"
                                      "temperature: 0.7\ncredit: none\n")
    (path / "tokenizer").mkdir()
    tok.save_pretrained(path / "tokenizer")
    return problems


def test_an_arith_run_directory_is_labelled_by_claims_with_the_rate_per_step(tok, tmp_path):
    run = tmp_path / "run"
    problems = write_arith_run(run, tok)
    result = audit(str(run), credit="grpo,ktae", tokenizer=str(run / "tokenizer"),
                   resamples=0)
    rate = result["right_answer_wrong_tokens"]
    assert set(rate["steps"]) == {"1", "3"}
    assert rate["steps"]["1"]["mean"] == rate["steps"]["3"]["mean"] == 0.5
    assert "claims" in result["input"]
    from ktae.credit_audit.run import run_input

    data = run_input(run, tokenizer=str(run / "tokenizer"), task="arith@difficulty=1")
    for g, p in zip(data.groups, problems, strict=True):
        assert g.level == p.kind
        # the prompt to score after is the chat rendering the recorded one was decoded from
        assert g.group.prompt == arith_input.chat_prompt(tok, p)
        assert g.labels == ["".join(claim_token_labels(tok, r, p.answer))
                            for r in g.group.responses]
        assert "w" in g.labels[0] and "w" in g.labels[2] and "w" not in g.labels[1]


def _cut_texts(a: int) -> list[str]:
    """Response 0 stops in the middle of its result (``12 + 12 = 2`` where ``24`` was being
    written); response 2's false claim is closed by a word before the end."""
    assert 2 * a >= 10
    return [f"So {a} + {a} = {str(2 * a)[0]}", f"The answer is {a}.",
            f"{a} + 1 = {a + 2} apples, so"]


@pytest.mark.parametrize("eos", [True, False], ids=["stopped", "cut-off"])
def test_an_arith_run_labels_a_response_cut_at_the_budget_as_cut_off(tok, tmp_path, eos):
    """A recorded response without its end-of-turn token ran out of budget: the claim its
    end leaves open is not labelled (nor counted in the rate); the same text that stopped
    is labelled false. A claim closed before the cut is labelled either way."""
    from ktae.credit_audit.run import run_input

    run = tmp_path / "run"
    problems = write_arith_run(run, tok, texts=_cut_texts, eos=eos)
    data = run_input(run, tokenizer=str(run / "tokenizer"), task="arith@difficulty=1")
    for g, p in zip(data.groups, problems, strict=True):
        a = int(p.answer)
        for text, ids, labels in zip(_cut_texts(a), g.group.responses, g.labels, strict=True):
            assert tok.decode(ids, skip_special_tokens=True) == text
            assert labels == "".join(claim_token_labels(tok, ids, p.answer, cut_off=not eos))
        pieces = [tok.decode([i]) for i in g.group.responses[0]]
        wrong0 = [x for x, lab in zip(pieces, g.labels[0], strict=True) if lab == "w"]
        assert wrong0 == ([str(2 * a)[0]] if eos else [])
        pieces = [tok.decode([i]) for i in g.group.responses[2]]
        wrong2 = "".join(x for x, lab in zip(pieces, g.labels[2], strict=True) if lab == "w")
        assert wrong2 == str(a + 2)
    result = audit(str(run), credit="grpo", tokenizer=str(run / "tokenizer"), resamples=0)
    # responses 0 and 1 are the right answers: response 0's false claim counts only when
    # the response stopped by itself
    rate = result["right_answer_wrong_tokens"]["steps"]
    assert rate["1"]["mean"] == rate["3"]["mean"] == (0.5 if eos else 0.0)


def test_an_arith_run_without_a_question_is_a_one_line_error(tok, tmp_path):
    run = tmp_path / "run"
    write_arith_run(run, tok)
    text = (run / "rollouts.jsonl").read_text().replace("How many", "How much")
    (run / "rollouts.jsonl").write_text(text)
    with pytest.raises(ValueError, match=r"^INPUT: .*rollouts.jsonl: prompt .* holds no arith "
                                         r"question") as err:
        audit(str(run), credit="grpo", tokenizer=str(run / "tokenizer"), resamples=0)
    assert "\n" not in str(err.value)


# --------------------------------------------------------------------------- the command


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    code = main(["audit", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_first_line_says_what_is_sampled_and_progress_shows(tiny_dir, tmp_path, capsys):
    args = ["--model", str(tiny_dir), "--prompts", "5", "--samples", "8", "--credit", "grpo",
            "--seed", "3", "--prompt-set", "2", "--resamples", "0", "-o", str(tmp_path / "a")]
    code, out, err = run_cli(capsys, *args)
    first = out.splitlines()[0]
    assert first.startswith("ktae audit: sampling 5 prompts x 8 responses from ")
    for part in ("arith@difficulty=1", "eval split", "chat template", "prompt set 2",
                 "seed 3", "temperature 0.7", "at most 64 new tokens",
                 "budget: 2560 new tokens"):
        assert part in first, part
    progress = [x for x in err.splitlines() if x.startswith("  sampled ")]
    # 4 prompts (32 sequences) per batch
    assert [x.split(" prompts")[0] for x in progress] == ["  sampled 4/5", "  sampled 5/5"]
    assert "about" in progress[0] and "left" in progress[0]
    # random weights make no mixed group with a false claim: a one-line error after sampling
    assert code == 2 and err.splitlines()[-1].startswith("ktae audit: INPUT: no mixed group")
    code, out, err = run_cli(capsys, *args, "--no-progress", "--task", "arith@difficulty=2",
                             "--temperature", "0.9", "--max-new-tokens", "8")
    assert "sampled" not in err
    first = out.splitlines()[0]
    assert "arith@difficulty=2" in first and "temperature 0.9" in first
    assert "at most 8 new tokens" in first


def test_the_default_budget_of_a_real_tokenizer_is_not_1024(tiny_dir, tmp_path, capsys):
    _, out, _ = run_cli(capsys, "--model", str(tiny_dir), "--prompts", "1", "--samples", "2",
                        "--task", "embedded", "--credit", "grpo", "--no-progress",
                        "-o", str(tmp_path / "e"))
    first = out.splitlines()[0]
    assert "embedded held-out prompts" in first and "temperature 1" in first
    assert "at most 256 new tokens" in first


@pytest.mark.parametrize(("argv", "message"), [
    (["--model", "default", "--task", "gsm8k"], "task: expected embedded, arith or "
                                                "arith@difficulty=0|1|2|3, got 'gsm8k'"),
    (["--model", "default", "--task", "arith@difficulty=5"], "task: arith takes "
                                                             "difficulty=0|1|2|3"),
    (["--model", "default", "--task", "arith@level=1"], "task: arith takes difficulty"),
    (["--model", "default", "--temperature", "0"], "temperature: expected > 0"),
    (["--model", "default", "--max-new-tokens", "0"], "max-new-tokens: expected a positive"),
])
def test_bad_arguments_are_one_line_errors(argv, message, tmp_path, capsys):
    code, out, err = run_cli(capsys, *argv, "-o", str(tmp_path / "x"))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(f"ktae audit: {message}")


def test_task_with_an_input_is_refused(tmp_path, tok, capsys):
    run = tmp_path / "run"
    write_arith_run(run, tok)
    code, _, err = run_cli(capsys, str(run), "--task", "arith", "-o", str(tmp_path / "x"))
    assert code == 2 and err.startswith("ktae audit: task: only when sampling from --model")
    assert err.count("\n") == 1


def test_the_chat_task_needs_a_chat_template(tmp_path, capsys):
    code, _, err = run_cli(capsys, "--model", "default", "--task", "arith", "--no-progress",
                           "-o", str(tmp_path / "x"))
    assert code == 2 and err.startswith("ktae audit: model: the arith task needs a tokenizer "
                                        "with a chat template")
    assert err.count("\n") == 1


# --------------------------------------------------------------------------- the real model


@pytest.mark.slow
def test_audit_of_smollm2_end_to_end(tmp_path, capsys):
    from ktae.models import smollm2

    if not smollm2.is_prepared() and os.environ.get("KTAE_REQUIRE_REAL_MODEL") != "1":
        pytest.skip("smollm2-135m is not prepared (`ktae models prepare smollm2-135m`); "
                    "KTAE_REQUIRE_REAL_MODEL=1 requires it")
    start = time.monotonic()
    # 6 x 6: five of the six groups are mixed, with wrong tokens to audit (4 x 4 had none)
    code, out, err = run_cli(capsys, "--model", "smollm2-135m", "--prompts", "6", "--samples",
                             "6", "--threads", "1", "-o", str(tmp_path / "audit"))
    took = time.monotonic() - start
    assert code == 0, err
    assert out.splitlines()[0].startswith("ktae audit: sampling 6 prompts x 6 responses from "
                                          "smollm2-135m on arith@difficulty=1")
    assert "  sampled 6/6 prompts (36 responses)" in err
    result = json.loads((tmp_path / "audit" / "audit.json").read_text())
    from ktae.credit_audit.run import default_methods

    assert list(result["methods"]) == default_methods()
    rate, counts = result["right_answer_wrong_tokens"]["all"], result["counts"]
    assert rate["responses"] == counts["responses"] - counts["wrong_answers"]
    assert "right answers holding a locally wrong token" in out
    assert result["counts"]["responses"] == 36 and took < 600
    # the sanity rules and the credit by kind of token on the real model's groups (checked
    # on this audit rather than on a second one that would sample the same groups again)
    oracle = result["sanity_rules"]["oracle"]["all"]
    random = result["sanity_rules"]["random"]["all"]
    assert oracle["blame"]["responses"] > 0
    assert oracle["blame"]["mean"] == 1.0 and oracle["lowest"]["mean"] == 1.0
    assert random["blame"]["low"] <= 0.5 <= random["blame"]["high"]
    by_kind = result["credit_by_kind"]
    assert by_kind["oracle"]["negative"]["wrong result"] == pytest.approx(1.0)
    # a real response ends its turn: the special tokens are a kind of their own
    assert by_kind["grpo"]["tokens"]["end of turn"] > 0
    assert by_kind["grpo"]["tokens"]["word"] > 0
