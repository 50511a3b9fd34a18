"""Silent failures made loud: a reward whose answer format no prompt asks for, and
characters the character-level tokenizer cannot represent."""

from __future__ import annotations

import warnings

import pytest

from ktae.data import Example
from ktae.models.tokenizer import build_char_tokenizer, warn_unknown_characters
from ktae.rewards.registry import warn_if_prompts_miss_the_format
from ktae.train.data import TaskRows, format_task


def _rows(problem="What is 3+4?"):
    return TaskRows([Example(str(i), problem, "7") for i in range(4)],
                    [Example("9", problem, "7")], embedded=False)


def test_dapo_without_an_answer_line_in_any_prompt_warns_once():
    with pytest.warns(UserWarning, match=r"--reward dapo reads the last 'Answer:' line, but "
                                         r"no prompt asks for one \(template qwen-math\)"):
        format_task(_rows(), "qwen-math", reward="dapo")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        format_task(_rows(), "qwen-math", reward="boxed")  # boxed: qwen-math asks for a box
        format_task(_rows("What is 3+4? Put your final Answer: on the last line."), "raw",
                    reward="dapo")
    assert not [w for w in caught if "Answer:" in str(w.message)]
    assert warn_if_prompts_miss_the_format("dapo", ["Solve.\nAnswer: $Answer"]) is False
    assert warn_if_prompts_miss_the_format("gsm8k", ["anything"]) is False


def test_characters_outside_the_char_vocabulary_are_named():
    tok = build_char_tokenizer()
    with pytest.warns(UserWarning, match=r"2 character\(s\) of the prompts .* dropped: "
                                         r"'é', 'π'"):
        format_task(_rows("What is π times é?"), "qwen-math", tokenizer=tok)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        format_task(_rows(), "qwen-math", tokenizer=tok)
    assert not [w for w in caught if "vocabulary" in str(w.message)]
    assert warn_unknown_characters(["ok"], tok) == set()


def test_evaluation_prompts_are_checked_too(monkeypatch):
    import torch

    import ktae.eval.runner as runner_mod
    from ktae.eval.benchmarks import BenchmarkRecord
    from ktae.models import build_tiny_model
    from ktae.models.generate import Generation

    torch.set_num_threads(1)
    tok = build_char_tokenizer()
    model = build_tiny_model(tok, hidden_size=16, num_layers=1, intermediate_size=32,
                             num_heads=2)
    monkeypatch.setattr(runner_mod, "generate_hf", lambda m, t, prompts, s, **kw:
                        [[Generation("\\boxed{7}", 3)] for _ in prompts])
    with pytest.warns(UserWarning, match="'∑'"):
        runner_mod.evaluate(model, tok, {"x": [BenchmarkRecord("0", "∑ 3+4", "7", "x")]},
                            template="compact")
