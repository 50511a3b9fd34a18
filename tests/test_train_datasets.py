"""``ktae train`` from dataset files: a verl-schema parquet with ``--reward dapo`` and a
MATH-schema JSONL with a level filter, on the shipped embedded model (2 steps each), and
the data options' checks before any model loads."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_train_helpers import assert_refused, read_jsonl

from ktae.cli import main
from ktae.tasks import format_prompt, generate

FAST = ["--max-steps", "2", "--num-prompts", "2", "--num-generations", "2", "--eval-every", "0",
        "--eval-size", "4", "--save-every", "0", "--no-progress", "--threads", "1",
        "--rollout-every", "1", "--rollout-groups", "2", "--algo", "grpo", "--credit", "ktae"]


def _problems(n: int, seed: int = 3):
    return generate(n, split="train", seed=seed)


def _verl_parquet(path, problems):
    pq.write_table(pa.Table.from_pylist([
        {"data_source": "math_dapo",
         "prompt": [{"role": "user", "content": format_prompt(p, "compact")}],
         "ability": "MATH", "reward_model": {"style": "rule", "ground_truth": p.answer},
         "extra_info": {"index": i, "split": "train"}} for i, p in enumerate(problems)]), path)
    return path


def _math_jsonl(path, problems):
    levels = ["Level 1", "Level 2", "Level 3", "Level 4", "Level 5"]
    rows = [{"problem": p.question, "level": levels[i % 5], "type": "Arithmetic",
             "solution": f"Add it up: {p.question}={p.answer}, so $\\boxed{{{p.answer}}}$."}
            for i, p in enumerate(problems)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows


@pytest.mark.slow
def test_train_from_a_verl_parquet_with_the_dapo_reward(tmp_path):
    """The rows' chat messages go in verbatim (``--template raw``); the shipped model
    answers in a box, never on an ``Answer:`` line, so DAPO's scorer gives every response
    -1 (the boxed reward would give 0 or 1): the reward that reached the trainer is dapo."""
    problems = _problems(12)
    data = _verl_parquet(tmp_path / "train.parquet", problems)
    out = tmp_path / "run"
    assert main(["train", "--task", f"parquet:{data}", "--reward", "dapo", "--template", "raw",
                 "-o", str(out), *FAST]) == 0
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["reward"] == -1.0 and m["accuracy"] == 0.0 for m in metrics)
    records = read_jsonl(out / "rollouts.jsonl")
    groups = [r for r in records if r["kind"] == "group"]
    compact = {format_prompt(p, "compact") for p in problems}
    assert groups and {g["prompt"] for g in groups} <= compact  # the messages, verbatim
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(records[0]["tokenizer"])
    texts = [tok.decode(ids, skip_special_tokens=True) for g in groups for ids in g["responses"]]
    assert any("\\boxed{" in t for t in texts) and not any("Answer:" in t for t in texts)
    evals = read_jsonl(out / "eval.jsonl")
    assert evals[-1]["n"] == 2 and evals[-1]["accuracy"] == 0.0  # held out: the last fifth
    config = (out / "config.yaml").read_text()
    assert "reward: dapo" in config and "template: raw" in config


@pytest.mark.slow
def test_train_from_a_math_jsonl_with_a_level_filter(tmp_path):
    problems = _problems(30, seed=5)
    rows = _math_jsonl(tmp_path / "math.jsonl", problems)
    eval_file = tmp_path / "held.jsonl"
    held = generate(4, split="test", seed=9)
    eval_file.write_text("".join(json.dumps({"question": p.question, "answer": p.answer}) + "\n"
                                 for p in held))
    out = tmp_path / "run"
    assert main(["train", "--task", f"jsonl:{tmp_path / 'math.jsonl'}", "--task-filter",
                 "level=Level 3,Level 4,Level 5", "--eval-task", f"jsonl:{eval_file}",
                 "-o", str(out), *FAST]) == 0
    kept = {f"Q:{r['problem']} A:" for r in rows if r["level"] in ("Level 3", "Level 4",
                                                                    "Level 5")}
    groups = [r for r in read_jsonl(out / "rollouts.jsonl") if r["kind"] == "group"]
    assert groups and {g["prompt"] for g in groups} <= kept
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    # boxed: 0 or 1 for each of the 4 responses of a step (dapo would give -1 or 1)
    assert all(0 <= m["reward"] <= 1 and (4 * m["reward"]).is_integer() for m in metrics)
    evals = read_jsonl(out / "eval.jsonl")
    assert [e["n"] for e in evals] == [4, 4]  # the whole --eval-task file
    card = (out / "README.md").read_text()
    assert "level in Level 3, Level 4, Level 5" in card and "held out" in card


def test_data_options_are_checked_before_any_model_loads(tmp_path, capsys, monkeypatch):
    from ktae.train import session

    def no_model(cfg, path=None):
        raise AssertionError("the model must not load")

    monkeypatch.setattr(session, "load_model", no_model)
    problems = _problems(10)
    good = _verl_parquet(tmp_path / "good.parquet", problems)
    _math_jsonl(tmp_path / "math.jsonl", problems)
    fake = tmp_path / "fake.parquet"
    fake.write_text("not parquet")
    nobox = tmp_path / "nobox.jsonl"
    nobox.write_text("".join(json.dumps({"problem": f"{i}+1", "solution": f"so \\boxed{{{i + 1}}}"})
                             + "\n" for i in range(5)) + json.dumps({"problem": "2+2",
                                                                   "solution": "it is 4"}) + "\n")
    rows = [{"data_source": "apps", "prompt": [{"role": "user", "content": "x"}],
             "reward_model": {"ground_truth": "1"}}] * 6
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "code.parquet")
    cases = [
        (["--task", f"parquet:{fake}"], "fake.parquet: not a Parquet file"),
        (["--task", f"jsonl:{tmp_path / 'math.jsonl'}", "--task-filter", "level=Level 9"],
         "task: filter level=Level 9: no row of"),
        (["--task", f"jsonl:{tmp_path / 'math.jsonl'}", "--task-filter", "subject=Algebra"],
         "has no column 'subject'"),
        (["--task", f"jsonl:{tmp_path / 'math.jsonl'}", "--task-field", "problem=query"],
         "field_map: problem='query'"),
        (["--task", f"jsonl:{tmp_path / 'math.jsonl'}", "--task-field", "prob=problem"],
         "task_fields: expected FIELD=COLUMN"),
        (["--task", f"jsonl:{tmp_path / 'math.jsonl'}", "--task-filter", "level"],
         "--task-filter: expected COLUMN=V1,V2"),
        (["--task", f"jsonl:{tmp_path / 'math.jsonl'}", "--task-filter", "level=Level 1",
          "--task-filter", "level=Level 2"], "level given twice"),
        (["--task", f"parquet:{tmp_path / 'code.parquet'}", "--reward", "auto"],
         "code.parquet, row 0: reward auto: no scorer for data_source 'apps'"),
        (["--task", "train.csv"], "task: expected jsonl:PATH"),
        (["--task", f"jsonl:{nobox}"], "nobox.jsonl, line 6: solution: no answer column and "
                                       "the solution has no complete \\boxed{}"),
        (["--task", f"parquet:{good}", "--eval-task", f"jsonl:{tmp_path / 'no.jsonl'}"],
         "eval_task: " + str(tmp_path / "no.jsonl") + ": no such file"),
        (["--task", f"parquet:{good}", "--template", "fancy"], "template: expected one of"),
        (["--template", "dapo"], "template: the embedded task takes"),
        (["--task-filter", "level=Level 3"], "task: the embedded task takes no"),
        (["--reward", "graded"], "reward: expected one of"),
    ]
    assert_refused(main, capsys, tmp_path / "out", cases)


def test_yaml_keys_of_the_data_options(tmp_path):
    import argparse

    from ktae.train import cli_train

    data = _verl_parquet(tmp_path / "t.parquet", _problems(10))
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"task: parquet:{data}\nreward: auto\ntemplate: chat\n"
                         "task_fields: {answer: reward_model.ground_truth}\n"
                         "task_filters: {data_source: math_dapo}\n"
                         f"eval_task: parquet:{data}\n")
    parser = argparse.ArgumentParser()
    cli_train.add_arguments(parser)
    cfg = cli_train.config_from_args(parser.parse_args(["--config", str(yaml_file)]))
    assert (cfg.reward, cfg.template, cfg.eval_task) == ("auto", "chat", f"parquet:{data}")
    assert cfg.task_fields == {"answer": "reward_model.ground_truth"}
    assert cfg.task_filters == {"data_source": ["math_dapo"]}  # a single value becomes a list
    from ktae.train.session import preflight

    checked = preflight(cfg)
    assert len(checked.task.train) == 10 and len(checked.task.eval) == 10
    assert {e.data_source for e in checked.task.train} == {"math_dapo"}


def test_compare_takes_the_data_options(tmp_path, capsys, monkeypatch):
    """``ktae compare`` passes the data options to every run and reads the data once per
    setting before any model loads (a filter keeping nothing: one line, exit 2)."""
    from ktae.train import cli_compare, session

    rows = _math_jsonl(tmp_path / "math.jsonl", _problems(30, seed=5))
    task = f"jsonl:{tmp_path / 'math.jsonl'}"
    seen = []

    class Stop(Exception):
        pass

    def fake_train(cfg, **_):
        seen.append(cfg)
        raise Stop

    monkeypatch.setattr(session, "load_model", lambda *a, **k: pytest.fail("model loaded"))
    assert main(["compare", "--task", task, "--task-filter", "level=Level 9", "--seeds", "1",
                 "--credit", "none,ktae", "-o", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert "filter level=Level 9: no row" in err and err.count("\n") == 1
    monkeypatch.setattr(session, "train", fake_train)
    with pytest.raises(Stop):
        main(["compare", "--task", task, "--task-filter", "level=Level 4,Level 5",
              "--task-field", "solution=solution", "--reward", "boxed", "--template", "raw",
              "--eval-task", task, "--seeds", "1", "--credit", "none", "-o", str(tmp_path / "c")])
    (cfg,) = seen
    assert cfg.task == task and cfg.eval_task == task and cfg.template == "raw"
    assert cfg.task_filters == {"level": ["Level 4", "Level 5"]}
    assert cfg.task_fields == {"solution": "solution"}
    checked = session.preflight(cfg)
    assert {e.problem for e in checked.task.train} == \
        {r["problem"] for r in rows if r["level"] in ("Level 4", "Level 5")}
    text = cli_compare.markdown_table({}, algo="grpo", steps=2, task=task)
    assert f"held-out part of {task}" in text


def test_chat_rows_and_plain_eval_rows_under_the_dapo_reward(tmp_path):
    """DAPO-Math-17k rows keep their messages; a MATH-style held-out set without messages
    gets the dapo instruction (what the dapo scorer reads), not the boxed one."""
    from ktae.eval.prompts import DAPO_PREFIX, DAPO_SUFFIX
    from ktae.train.data import format_task, read_task

    class Tok:
        chat_template = "x"

        def __len__(self):
            return 150_000

        def apply_chat_template(self, messages, *, tokenize, add_generation_prompt):
            return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"

    verl = [{"data_source": "math_dapo",
             "prompt": [{"role": "user", "content": f"{DAPO_PREFIX}What is {i}+1?{DAPO_SUFFIX}"}],
             "reward_model": {"ground_truth": str(i + 1)}} for i in range(6)]
    pq.write_table(pa.Table.from_pylist(verl), tmp_path / "d.parquet")
    (tmp_path / "m.jsonl").write_text(json.dumps({"problem": "What is 9+1?", "answer": "10"}))
    task = read_task(f"parquet:{tmp_path / 'd.parquet'}", train_size=1, eval_size=10, seed=0,
                     eval_task=f"jsonl:{tmp_path / 'm.jsonl'}")
    from ktae.train.data import default_template

    assert default_template(task, Tok(), "dapo") == "chat"
    train, held = format_task(task, "chat", Tok(), "dapo")
    assert train[0]["prompt"] == f"user:{DAPO_PREFIX}What is 0+1?{DAPO_SUFFIX}|assistant:"
    assert held[0]["prompt"] == f"user:{DAPO_PREFIX}What is 9+1?{DAPO_SUFFIX}|assistant:"
    assert train[0]["data_source"] == "math_dapo" and held[0]["data_source"] is None
    _, boxed_held = format_task(task, "chat", Tok(), "boxed")
    assert "\\boxed{}" in boxed_held[0]["prompt"]


def test_the_gpu_recipes_parse_and_resolve():
    """docs/training.md's GPU recipes are `ktae train --config configs/...` commands; their
    parsing and the paper values of each config are tests/test_recipes.py's."""
    import re
    from pathlib import Path

    from ktae.runs.config import TrainConfig

    root = Path(__file__).parents[1]
    text = (root / "docs" / "training.md").read_text()
    section = text[text.index("### GPU recipes"):text.index("## From Python")]
    configs = re.findall(r"ktae train --config (configs/\S+\.yaml)", section)
    assert len(configs) >= 6
    for config in configs:
        cfg = TrainConfig.from_file(root / config).resolve()
        assert cfg.task != "embedded" and cfg.bf16


def test_math500_offline_says_what_to_do(monkeypatch):
    import datasets

    from ktae.train.data import read_task

    def offline(*a, **k):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match="task: MATH-500 could not be loaded .* --task jsonl:PATH"):
        read_task("math500", train_size=1, eval_size=5, seed=0)
    monkeypatch.setattr(datasets, "load_dataset",
                        lambda *a, **k: datasets.Dataset.from_list(
                            [{"problem": f"{i}+1", "answer": str(i + 1),
                              "unique_id": f"test/{i}.json"} for i in range(6)]))
    task = read_task("math500", train_size=1, eval_size=5, seed=0)
    assert [e.id for e in task.train][:2] == ["test/0.json", "test/1.json"]
    assert len(task.train) == 5 and len(task.eval) == 1
