"""KTAE's options: misspelled, non-finite, out-of-range or mistyped values raise a
``ValueError`` naming the option; the core's modules import each other without cycles."""

from __future__ import annotations

import ast
import inspect
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import ktae
from ktae.core.ktae import ktae_advantages
from ktae.core.ktae_options import MAX_WEIGHT


def _batch():
    g = torch.Generator().manual_seed(0)
    return dict(rewards=(torch.rand(12, generator=g) < 0.5).float(), group=[0] * 6 + [1] * 6,
                token_ids=torch.randint(0, 7, (12, 9), generator=g),
                mask=torch.rand(12, 9, generator=g) < 0.8)


def _both(**opts):
    """Run the estimator and the table with ``opts``; return the two exceptions."""
    errors = []
    for fn in (lambda: ktae.compute_advantages("ktae", **_batch(), **opts),
               lambda: ktae.key_token_table(**_batch(), **opts)):
        with pytest.raises(ValueError) as info:
            fn()
        errors.append(str(info.value))
    return errors


@pytest.mark.parametrize("typo", ["h_1", "chunk_token", "ngrams", "threshold"])
def test_misspelled_options_are_named_with_the_valid_ones(typo):
    for message in _both(**{typo: 1}):
        assert message.startswith(f"{typo}: unknown option for "), message
        for valid in ("h1", "k1", "ignore_token_ids", "mode", "ngram", "chunk_tokens"):
            assert valid in message, message


def test_estimator_and_table_take_the_same_options():
    est = inspect.signature(ktae_advantages).parameters
    table = inspect.signature(ktae.key_token_table).parameters
    opts = {k for k, p in est.items() if p.kind is p.KEYWORD_ONLY}
    assert opts == {k for k, p in table.items() if p.kind is p.KEYWORD_ONLY} - {
        "rewards", "group", "token_ids", "mask"}
    # chunk_tokens is honoured by the table too: results do not depend on it
    full = ktae.key_token_table(**_batch(), chunk_tokens=10**9)
    small = ktae.key_token_table(**_batch(), chunk_tokens=5)
    assert len(full) == len(small)
    for f in ("group", "token", "a", "b", "c", "d"):
        assert torch.equal(getattr(full, f), getattr(small, f)), f
    torch.testing.assert_close(full.value, small.value, rtol=0, atol=1e-12)


@pytest.mark.parametrize("name, value", [
    ("h1", math.inf), ("h2", math.nan), ("h3", -math.inf), ("k1", math.inf),
    ("top", math.inf), ("top", 1e308), ("top", MAX_WEIGHT * 2), ("h3", 1e300),
    ("k1", 1e7), ("h1", -1.0), ("top", -0.5),
])
def test_non_finite_or_unbounded_weights_are_refused(name, value):
    for message in _both(**{name: value}):
        assert message.startswith(f"{name}: expected a non-negative finite number <= 1e+06"), \
            message


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, "0.5"])
def test_reward_threshold_must_be_finite(value):
    for message in _both(reward_threshold=value):
        assert message.startswith("reward_threshold: expected a finite number"), message


@pytest.mark.parametrize("opts, match", [
    (dict(b="x"), "b: expected 0 <= b <= 1, got str 'x'"),
    (dict(b=True), "b: expected 0 <= b <= 1, got bool"),
    (dict(b=math.nan), "b: expected 0 <= b <= 1"),
    (dict(h1="1"), "h1: expected a non-negative finite number"),
    (dict(ignore_token_ids=5), r"ignore_token_ids: expected a list of token ids \(e.g. \[5\]\)"),
    (dict(ignore_token_ids="5"), "ignore_token_ids: expected a list of token ids, got str"),
    (dict(ignore_token_ids=[2**70]), r"ignore_token_ids: expected token ids in \[0, 2\*\*63\)"),
    (dict(ignore_token_ids=[-1]), r"ignore_token_ids: expected token ids in \[0, 2\*\*63\)"),
    (dict(ignore_token_ids=[1.5]), "ignore_token_ids: expected integer token ids, got 1.5"),
    (dict(ignore_token_ids=torch.tensor([1.0])), "ignore_token_ids: expected a 1-D integer"),
    (dict(ignore_token_ids=np.array([[1]])), "ignore_token_ids: expected a 1-D integer"),
    (dict(chunk_tokens="a"), "chunk_tokens: expected a positive integer, got 'a'"),
    (dict(chunk_tokens=2.5), "chunk_tokens: expected a positive integer"),
    (dict(chunk_tokens=0), "chunk_tokens: expected a positive integer"),
    (dict(mode=["exact"]), "mode: expected 'exact' or 'reference'"),
    (dict(base=["grpo"]), "base: expected one of"),
    (dict(ngram=0), "ngram: expected a positive integer"),
    (dict(ngram=2.0), "ngram: expected a positive integer"),
    (dict(ngram=True), "ngram: expected a positive integer"),
    (dict(ngram_reduce="max"), "ngram_reduce: expected 'maxabs' or 'mean'"),
    (dict(mode="reference", ngram=2), "ngram: the reference mode reproduces the released"),
    (dict(mode="reference", reward_threshold=0.5), "reward_threshold: the reference mode"),
])
def test_mistyped_options_name_the_option(opts, match):
    for message in _both(**opts):
        assert re.search(match, message), message


def test_valid_option_types():
    """Integers, numpy scalars, 0-d tensors and integer id tensors/arrays/sets are fine."""
    base = ktae.compute_advantages("ktae", **_batch(), h1=1.0, k1=2.0, ignore_token_ids=[3, 4])
    for opts in (dict(h1=1, k1=np.float32(2.0), ignore_token_ids=torch.tensor([4, 3])),
                 dict(h1=torch.tensor(1.0), ignore_token_ids=np.array([3, 4], dtype=np.uint8)),
                 dict(ignore_token_ids={3, 4}, chunk_tokens=np.int64(4))):
        torch.testing.assert_close(ktae.compute_advantages("ktae", **_batch(), **opts), base)
    assert torch.isfinite(ktae.compute_advantages("ktae", **_batch(), top=MAX_WEIGHT, h3=MAX_WEIGHT,
                                                  k1=MAX_WEIGHT)).all()


# ---------------------------------------------------------------------------- layering


def _core_imports() -> dict[str, set[str]]:
    """``module -> core modules it imports`` (any depth: functions included)."""
    core = Path(ktae.__file__).parent / "core"
    names = {p.stem for p in core.glob("*.py")}
    graph = {}
    for path in core.glob("*.py"):
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                mod = node.module
                if mod == "ktae.core":
                    deps |= {a.name for a in node.names if a.name in names}
                elif mod.startswith("ktae.core."):
                    deps.add(mod.split(".")[2])
            elif isinstance(node, ast.Import):
                deps |= {a.name.split(".")[2] for a in node.names
                         if a.name.startswith("ktae.core.")}
        graph[path.stem] = deps - {path.stem}
    return graph


def test_core_modules_import_each_other_without_cycles():
    graph = _core_imports()
    assert "ktae" not in graph["ktae_reference"] and "ktae_reference" in graph["ktae"]
    state: dict[str, int] = {}

    def visit(node, path):
        if state.get(node) == 1:
            raise AssertionError("import cycle: " + " -> ".join(path + [node]))
        if state.get(node) == 2:
            return
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            visit(dep, path + [node])
        state[node] = 2

    for node in sorted(graph):
        visit(node, [])
