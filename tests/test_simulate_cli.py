"""``ktae simulate``: the command line, its outputs, and the report's numbers."""

from __future__ import annotations

import json

import pytest
import torch
from oracle import single_thread  # noqa: F401  (one torch thread for this module)

from ktae.cli import build_parser, main
from ktae.sim import report
from ktae.sim.cli import config_from_args
from ktae.sim.config import Setting, SimConfig
from ktae.sim.run import SimResult

TINY = ["--actions", "16", "--steps", "12", "--seeds", "2", "--eval-every", "4",
        "--horizon", "2,4", "--n-opt", "1,3", "--group-size", "2,4", "--threads", "1"]


def test_cli_writes_every_output(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", *TINY, "--methods", "all", "--target", "0.5",
                 "--device", "cpu", "-o", str(out)]) == 0
    for name in ("results.md", "curves.json", "curves_H.png", "curves_n_opt.png",
                 "curves_G.png"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "curves_H.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (out / "results.md").read_text()
    assert "**H axis (n_opt = 3, G = 4): final normalised return**" in text
    assert "steps to reach 0.5" in text and "| ktae+taco |" in text and "± " in text
    data = json.loads((out / "curves.json").read_text())
    assert data["eval_steps"] == [0, 4, 8, 12]
    methods = {c["method"] for c in data["curves"]}
    assert {"broadcast", "step", "ktae", "taco", "ktae+taco", "stapo"} <= methods
    # 12 methods x 4 distinct settings (the base is shared by the axes), 2 seeds each.
    assert len(data["curves"]) == len(methods) * 4
    assert all(len(c["returns"]) == 2 and len(c["returns"][0]) == 4 for c in data["curves"])
    assert len(data["claims"]) == 4
    captured = capsys.readouterr()
    assert "Paper's claims" in captured.out and "step-level credit beats broadcast" in captured.out
    assert "ktae simulate:" in captured.err and "update" in captured.err  # the progress bar


def test_cli_ktae_threshold_and_quiet(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", *TINY, "--methods", "ktae", "--ktae-threshold", "0.25",
                 "--no-progress", "-o", str(out)]) == 0
    data = json.loads((out / "curves.json").read_text())
    assert data["config"]["ktae_threshold"] == 0.25
    assert data["claims"][0]["held"] is None  # needs broadcast and step
    assert "update/s" not in capsys.readouterr().err


@pytest.mark.parametrize("flags,expected", [([], 1), (["--threads", "2"], 2)])
def test_cli_threads_default_to_one_and_are_set(tmp_path, flags, expected):
    """One thread unless told (benchmarks/bench_cli_threads.py: fastest idle or busy)."""
    no_threads = TINY[:-2]
    assert TINY[-2:] == ["--threads", "1"]
    torch.set_num_threads(3)
    try:
        assert main(["simulate", *no_threads, *flags, "--methods", "broadcast",
                     "--no-progress", "-o", str(tmp_path / "sim")]) == 0
        assert torch.get_num_threads() == expected
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("flags,message", [
    (["--actions", "0"], "actions: expected a positive integer, got 0"),
    (["--actions", "8", "--n-opt", "9"], "n_opt: expected at most actions = 8"),
    (["--methods", "broadcast,nope"], "methods: unknown method 'nope'"),
    (["--threads", "0"], "threads: expected a positive integer"),
])
def test_cli_bad_arguments(tmp_path, capsys, flags, message):
    assert main(["simulate", *flags, "-o", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cli_presets_and_overrides():
    parse = build_parser(["simulate"]).parse_args
    paper = config_from_args(parse(["simulate", "--preset", "paper"]))
    assert (paper.actions, paper.steps, paper.lr, paper.seeds, paper.eval_every) == (
        100_000, 8_000, 0.2, 10, 100)
    assert "taco-random" in paper.method_names and "stapo" in paper.method_names
    quick = config_from_args(parse(["simulate", "--horizon", "8", "--steps", "10"]))
    assert quick.horizons == (8,) and quick.steps == 10 and quick.actions == 1000
    assert quick.method_names == ("broadcast", "step", "ktae", "ktae-graded", "taco",
                                  "ktae+taco")
    assert quick.lr == 0.2  # the paper's learning rate
    with pytest.raises(SystemExit):
        parse(["simulate", "--horizon", "4,x"])


# ------------------------------------------------------------------ report numbers


def _result(curves_by_method: dict[str, dict[int, list[list[float]]]]) -> SimResult:
    cfg = SimConfig(horizons=(2, 8), n_opts=(1,), group_sizes=(4,), actions=4, steps=20,
                    eval_every=10, seeds=2, methods=tuple(curves_by_method))
    curves = {(m, Setting(h, 1, 4)): torch.tensor(v, dtype=torch.float64)
              for m, per_h in curves_by_method.items() for h, v in per_h.items()}
    return SimResult(cfg, cfg.eval_steps(), curves, 1.0)


def test_report_definitions():
    c = torch.tensor([[0.0, 0.5, 1.0], [0.2, 0.95, 0.97]], dtype=torch.float64)
    # trapezoid over steps 0, 10, 20 divided by 20
    torch.testing.assert_close(report.mean_return(c, [0, 10, 20]),
                               torch.tensor([0.5, (0.575 + 0.96) / 2], dtype=torch.float64))
    assert report.steps_to_target(c, [0, 10, 20], 0.9) == [20, 10]
    assert report.steps_to_target(c, [0, 10, 20], 0.99) == [20, None]


def test_claims_are_computed_from_the_curves():
    flat = [[0.1, 0.1, 0.1]] * 2
    res = _result({"broadcast": {2: flat, 8: flat},
                   "step": {2: [[0.1, 0.3, 0.3]] * 2, 8: [[0.1, 0.9, 0.9]] * 2},
                   "ktae": {2: [[0.1, 0.2, 0.2]] * 2, 8: [[0.1, 0.5, 0.5]] * 2}})
    claims = report.claims(res)
    assert claims[0].held is True and "2 of 2" in claims[0].detail
    assert claims[1].held is True  # wider at H = 8
    assert claims[2].held is None and claims[3].held is None  # one value on those axes
    land = report.landing(res)
    assert land["broadcast"]["share_of_oracle_gain"] == pytest.approx(0.0)
    assert land["step"]["share_of_oracle_gain"] == pytest.approx(1.0)
    assert 0 < land["ktae"]["share_of_oracle_gain"] < 1
    text = report.summary_paragraph(res)
    assert "step-level credit beats broadcast: held" in text and "ktae +" in text
    # The other way round, the claims do not hold.
    swapped = _result({"broadcast": {2: [[0.1, 0.9, 0.9]] * 2, 8: [[0.1, 0.3, 0.3]] * 2},
                       "step": {2: flat, 8: flat}})
    assert [c.held for c in report.claims(swapped)[:2]] == [False, False]


def test_first_seed_runs_the_seeds_kept_aside(tmp_path, capsys):
    """``--first-seed 1 --seeds 1`` is seed 1 of a two-seed run: the same curve, and the
    report names the seeds."""
    flags = ["--actions", "16", "--steps", "8", "--eval-every", "4", "--horizon", "4",
             "--n-opt", "3", "--group-size", "4", "--threads", "1", "--methods",
             "broadcast,ktae", "--no-progress"]
    assert main(["simulate", *flags, "--seeds", "2", "-o", str(tmp_path / "both")]) == 0
    assert main(["simulate", *flags, "--seeds", "1", "--first-seed", "1",
                 "-o", str(tmp_path / "aside")]) == 0
    capsys.readouterr()
    both = json.loads((tmp_path / "both" / "curves.json").read_text())
    aside = json.loads((tmp_path / "aside" / "curves.json").read_text())
    assert aside["config"]["first_seed"] == 1
    for a, b in zip(aside["curves"], both["curves"], strict=True):
        # the same seed in a block of another size: equal up to float32 rounding of the
        # batched sums (returns are in [0, 1])
        assert a["method"] == b["method"]
        assert a["returns"][0] == pytest.approx(b["returns"][1], abs=1e-6)
    assert "1 seeds (1..1)," in (tmp_path / "aside" / "results.md").read_text()
    assert main(["simulate", *flags, "--first-seed", "-1", "-o", str(tmp_path / "x")]) == 2
    assert "first_seed: expected an integer >= 0, got -1" in capsys.readouterr().err
