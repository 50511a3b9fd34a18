"""A run that learns nothing says so: the check on synthetic step records, the accuracy
reward's format share, a real ``ktae train`` that cannot learn, and ``ktae eval``'s notice."""

from __future__ import annotations

import json
import os
import warnings

import pytest

from ktae.cli import main
from ktae.train.no_signal import (
    DEFAULT_STEPS,
    TRUNCATION_SHARE,
    NoSignalWarning,
    find_no_signal,
)
from ktae.train.reward_funcs import FORMATTED_METRIC, make_accuracy_reward


def rec(step, *, mixed=0.0, acc=0.0, trunc=0.0, fmt=None):
    out = {"step": step, "mixed_group_fraction": mixed, "accuracy": acc,
           "truncated_fraction": trunc}
    if fmt is not None:
        out["formatted_fraction"] = fmt
    return out


def test_needs_k_consecutive_unmixed_steps():
    # a mixed step (step 3) restarts the count: the window is steps 4-6
    records = [rec(1, acc=0.5), rec(2, acc=0.5), rec(3, mixed=0.25, acc=0.5),
               *[rec(s, acc=0.5, fmt=0.5) for s in (4, 5, 6, 7)]]
    assert find_no_signal(records[:5], steps=3) is None
    found = find_no_signal(records, steps=3)
    assert (found.first, found.last, found.steps, found.unmixed) == (4, 6, 3, True)
    assert found.causes == ("unmixed",) and "--num-generations" in found.message
    assert find_no_signal(records, steps=4).first == 4
    assert find_no_signal(records, steps=5) is None
    assert find_no_signal(records, steps=0) is None
    with pytest.raises(ValueError, match="steps: expected a non-negative integer"):
        find_no_signal(records, steps=-1)


@pytest.mark.parametrize("acc, fmt, cause, words", [
    (0.0, 0.0, "format", "no response was formatted for --reward boxed"),
    (0.0, 0.3, "too_hard", "task too hard"),
    (1.0, 1.0, "too_easy", "task too easy"),
    (0.0, None, "too_hard", "task too hard"),  # a reward that does not report its format
])
def test_cause_of_unmixed_steps(acc, fmt, cause, words):
    records = [rec(s, acc=acc, fmt=fmt) for s in range(1, DEFAULT_STEPS + 1)]
    found = find_no_signal(records, reward="boxed", max_new_tokens=64)
    assert found is not None and found.causes == (cause,) and words in found.message
    assert found.to_dict()["causes"] == [cause]
    assert find_no_signal(records[:-1]) is None  # one step short of the default window


def test_truncation_alone_or_with_unmixed_groups():
    over = TRUNCATION_SHARE + 0.1
    # mixed groups but most responses truncated for K steps: still reported
    records = [rec(s, mixed=0.5, acc=0.4, trunc=over, fmt=0.2) for s in range(1, 4)]
    found = find_no_signal(records, steps=3, max_new_tokens=96)
    assert found.causes == ("truncation",) and not found.unmixed
    assert "60% of responses hit max_new_tokens=96" in found.message
    # exactly half truncated is not "most"
    half = [rec(s, mixed=0.5, trunc=TRUNCATION_SHARE) for s in range(1, 4)]
    assert find_no_signal(half, steps=3) is None
    # never formatted and truncated: both named, the format first
    both = [rec(s, trunc=0.75, fmt=0.0) for s in range(1, 4)]
    assert find_no_signal(both, steps=3, reward="dapo").causes == ("format", "truncation")


def test_accuracy_reward_logs_the_share_of_formatted_responses():
    logged = []
    accuracy = make_accuracy_reward(reward="boxed", stop_ids=[0])
    ended = [[5, 0]] * 4  # every response's ids end with its stop id
    scores = accuracy(["so \\boxed{7}", "7", "\\boxed{8}", "\\boxed{"], answer=["7"] * 4,
                      completion_ids=ended,
                      log_metric=lambda name, value: logged.append((name, value)))
    assert scores == [1.0, 0.0, 0.0, 0.0]
    assert logged == [(FORMATTED_METRIC, 0.5)]
    # without TRL's log_metric
    assert accuracy(["\\boxed{7}"], answer=["7"], completion_ids=ended[:1]) == [1.0]


@pytest.mark.slow
def test_a_run_that_cannot_learn_warns_once_and_records_it(tmp_path, capsys):
    """The shipped tiny model asked for an 'Answer:' line it never writes (--reward dapo
    under the compact template): every response scores -1, no group is mixed."""
    out = tmp_path / "run"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code = main(["train", "--reward", "dapo", "--max-steps", "3", "--num-prompts", "2",
                     "--num-generations", "2", "--max-new-tokens", "8", "--train-size", "32",
                     "--eval-size", "4", "--eval-every", "0", "--save-every", "0",
                     "--no-signal-steps", "2", "--no-progress", "-o", str(out)])
    assert code == 0
    found = [w for w in caught if issubclass(w.category, NoSignalWarning)]
    assert len(found) == 1  # once, though steps 2-3 are a second window
    assert "no learning signal in steps 1-2" in str(found[0].message)
    assert "no response was formatted for --reward dapo" in str(found[0].message)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["no_signal"]["causes"][0] == "format"
    assert (summary["no_signal"]["first"], summary["no_signal"]["last"]) == (1, 2)
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert all(m["formatted_fraction"] == 0 and m["mixed_group_fraction"] == 0
               for m in metrics)


def _smollm2_tokenizer():
    from ktae.models import smollm2

    if not smollm2.is_prepared() and os.environ.get("KTAE_REQUIRE_REAL_MODEL") != "1":
        pytest.skip("smollm2-135m is not prepared (`ktae models prepare smollm2-135m`)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2.prepared_path())


@pytest.mark.slow
def test_bpe_chat_model_that_never_boxes_is_told_so(tmp_path):
    """SmolLM2's tokenizer and chat template on a tiny random Llama: its responses never
    close a \\boxed{}, which the warning names."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from ktae.runs.config import TrainConfig
    from ktae.train.session import train

    tok = _smollm2_tokenizer()
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id, tie_word_embeddings=True))
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    task = tmp_path / "task.jsonl"
    task.write_text("".join(json.dumps({"problem": f"What is {a} plus {b}?",
                                        "answer": str(a + b)}) + "\n"
                            for a in range(2, 7) for b in range(3, 7)))
    cfg = TrainConfig(model=str(tmp_path / "model"), task=f"jsonl:{task}", template="chat",
                      output_dir=str(tmp_path / "run"), max_steps=2, num_prompts=2,
                      num_generations=2, max_new_tokens=6, eval_size=2, eval_every=0,
                      save_every=0, progress=False, no_signal_steps=2).resolve()
    with pytest.warns(NoSignalWarning, match="no response was formatted for --reward boxed"):
        summary = train(cfg)
    assert summary["no_signal"]["causes"][0] == "format"


def test_eval_says_when_no_response_was_formatted(tmp_path, capsys):
    records = tmp_path / "responses.jsonl"
    records.write_text(
        json.dumps({"benchmark": "plain", "answer": "7", "response": ["7", "It is 7."]}) + "\n"
        + json.dumps({"benchmark": "boxed", "answer": "7", "response": ["\\boxed{7}", "8"]})
        + "\n")
    assert main(["eval", "--responses", str(records), "-o", str(tmp_path / "o")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "no response was" in ln]
    assert len(lines) == 1
    assert "no response was formatted on plain:" in lines[0] and "boxed" in lines[0]
    assert "samples_plain.jsonl" in lines[0] and "on boxed" not in lines[0]
    both = tmp_path / "both.jsonl"
    both.write_text(json.dumps({"benchmark": "b", "answer": "7", "response": ["\\boxed{7}"]})
                    + "\n")
    assert main(["eval", "--responses", str(both), "-o", str(tmp_path / "p")]) == 0
    assert "no response was formatted" not in capsys.readouterr().out
