"""scripts/tables.py: every marked table of the docs has a generator, and a cheap one,
regenerated from its command, equals the committed text."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tables():
    spec = importlib.util.spec_from_file_location("docs_tables", REPO / "scripts" / "tables.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_tables"] = module
    spec.loader.exec_module(module)
    return module


def test_markers_are_well_formed_and_registered(tables):
    blocks = tables.all_blocks()  # raises on an unclosed, nested or malformed marker
    assert blocks
    for b in blocks:
        assert b.name in tables.TABLES, f"{b.path}:{b.start + 1}: no generator for {b.name!r}"
        assert b.body.startswith("| ") and "\n|---" in b.body, f"{b.name}: not a table"
    marked = {b.name for b in blocks}
    assert set(tables.TABLES) <= marked, f"registered but not in the docs: " \
                                         f"{set(tables.TABLES) - marked}"
    for table in tables.TABLES.values():
        for run in table.runs:
            assert run in tables.RUNS
            assert all(dep in tables.RUNS for dep in tables.dependencies(run))


@pytest.mark.parametrize("text, message", [
    ("<!-- table: a -->\n| x |\n", "never closed"),
    ("<!-- /table -->\n", "without an opening"),
    ("<!-- table: a -->\n<!-- table: b -->\n<!-- /table -->\n", "opens inside"),
    ("<!-- table:a -->\n<!-- /table -->\n", "malformed"),
])
def test_malformed_markers_are_refused(tables, tmp_path, text, message):
    path = tmp_path / "doc.md"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        tables.blocks(path)


def test_replace_rewrites_only_between_markers(tables, tmp_path):
    path = tmp_path / "doc.md"
    path.write_text("before\n<!-- table: a -->\n\n| old |\n|---|\n\n<!-- /table -->\nafter\n")
    tables.replace(tables.blocks(path)[0], "| new |\n|---|")
    assert path.read_text() == ("before\n<!-- table: a -->\n\n| new |\n|---|\n\n"
                                "<!-- /table -->\nafter\n")


def test_cheap_table_regenerates_as_committed(tables, tmp_path, monkeypatch):
    # simulate-small: float64 returns from seeded uniforms, printed with 3 decimals (shares
    # as whole percents). The simulator's values do not depend on the thread count (its
    # curves.json was bitwise the same at --threads 1 and 2), so the text is compared
    # exactly: a mismatch means the command, the simulator or the table's format changed.
    monkeypatch.setattr(tables, "CACHE", tmp_path)
    tables.execute("simulate-small", reuse=False, done=set())
    committed = [b.body for b in tables.all_blocks() if b.name == "simulate-small"]
    assert committed == [tables.render("simulate-small")]


def test_a_finished_run_keeps_its_record_and_renders_from_it(tables, tmp_path, monkeypatch):
    # A run writes two files and keeps one; a second run reads the first one's folder.
    monkeypatch.setattr(tables, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(tables, "RECORDS", tmp_path / "records")
    write = ("python -c \"import pathlib, sys; o = pathlib.Path(sys.argv[1]); "
             "(o / 'kept.json').write_text('{\\\"x\\\": 1}'); (o / 'big.bin').write_text('z')\" {out}")
    read = ("python -c \"import pathlib, sys; (pathlib.Path(sys.argv[2]) / 'kept.json')"
            ".write_text((pathlib.Path(sys.argv[1]) / 'kept.json').read_text())\" {run:a} {out}")
    monkeypatch.setitem(tables.RUNS, "a", tables.Run(write, 1, ("kept.json",)))
    monkeypatch.setitem(tables.RUNS, "b", tables.Run(read, 1, ("kept.json",)))
    tables.execute("a", reuse=False, done=set())
    assert sorted(p.name for p in (tmp_path / "records" / "a").iterdir()) == ["kept.json"]
    assert tables.is_done("a") and tables.run_dir("a") == tmp_path / "cache" / "a"
    # the cache is lost: the record still counts as the finished run for the tables
    import shutil
    shutil.rmtree(tmp_path / "cache")
    assert tables.is_done("a") and not tables.is_done("a", cache_only=True)
    assert tables.run_dir("a") == tmp_path / "records" / "a"
    tables.execute("a", reuse=True, done=set())  # reused: nothing runs
    assert not (tmp_path / "cache" / "a").exists()
    # but a run that reads a's folder needs a's cache, so a runs again first
    tables.execute("b", reuse=True, done=set())
    assert (tmp_path / "cache" / "a" / "big.bin").is_file()
    assert (tmp_path / "records" / "b" / "kept.json").read_text() == '{"x": 1}'
    # a changed command is not the same run: its record is not reused
    monkeypatch.setitem(tables.RUNS, "a", tables.Run(write + " ", 1, ("kept.json",)))
    assert not tables.is_done("a")


def test_a_record_folder_the_script_did_not_write_is_refused(tables, tmp_path, monkeypatch):
    monkeypatch.setattr(tables, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(tables, "RECORDS", tmp_path / "records")
    write = "python -c \"import pathlib, sys; (pathlib.Path(sys.argv[1]) / 'k.json').write_text('1')\" {out}"
    monkeypatch.setitem(tables.RUNS, "a", tables.Run(write, 1, ("k.json",)))
    (tmp_path / "records" / "a").mkdir(parents=True)
    (tmp_path / "records" / "a" / "mine.txt").write_text("keep me")
    with pytest.raises(SystemExit, match="was not written by this script"):
        tables.execute("a", reuse=False, done=set())
    assert (tmp_path / "records" / "a" / "mine.txt").read_text() == "keep me"


def test_starting_point_interval_resamples_problems(tables, tmp_path):
    # every problem passes 0 or 8 of 8: the interval is wide, as it must be when whole
    # problems, not samples, are what varies; equal problems give a zero-width interval
    low, high = tables._problem_bootstrap([0, 8] * 10, 8)
    assert low < 0.35 and high > 0.65 and low <= 0.5 <= high
    assert tables._problem_bootstrap([2] * 12, 8) == (0.25, 0.25)
    result = {"temperature": 0.6, "problems": 20, "samples": 8, "sampled_pass": 0.5,
              "mixed_groups": 0.0, "greedy_accuracy": 0.5, "truncated": 0.1, "mean_tokens": 40,
              "pass_by_kind": {"mul": 0.5}, "passes_per_problem": [0, 8] * 10}
    (tmp_path / "baseline.json").write_text(json.dumps(
        {"model": "m", "max_new_tokens": 64, "seed": 1, "results": {"0": result}}))
    table = tables.arith_baseline(tmp_path)
    assert "(T = 0.6)" in table and "truncated at 64 tokens" in table
    assert f"| 0 | 50.0% [{low:.1%}, {high:.1%}] | 0% | 50% |" in table


def test_a_resumable_run_cut_off_continues_in_its_folder(tables, tmp_path, monkeypatch):
    """A resumable run's folder, left unfinished, is run again in place (its work kept);
    a run that is not resumable starts from an empty folder."""
    monkeypatch.setattr(tables, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(tables, "RECORDS", tmp_path / "records")
    # appends a line to progress.txt and fails on the first call: the cut-off run
    step = ("python -c \"import pathlib, sys; p = pathlib.Path(sys.argv[1]) / 'progress.txt'; "
            "old = p.read_text() if p.exists() else ''; p.write_text(old + 'x'); "
            "sys.exit(1 if old == '' else 0)\" {out}")
    for name, resumable in (("r", True), ("n", False)):
        monkeypatch.setitem(tables.RUNS, name, tables.Run(step, 1, ("progress.txt",),
                                                          resumable=resumable))
        with pytest.raises(SystemExit, match="failed"):
            tables.execute(name, reuse=True, done=set())
        assert (tmp_path / "cache" / name / "progress.txt").read_text() == "x"
    tables.execute("r", reuse=True, done=set())
    assert (tmp_path / "records" / "r" / "progress.txt").read_text() == "xx"  # continued
    with pytest.raises(SystemExit, match="failed"):  # started over: fails again
        tables.execute("n", reuse=True, done=set())
    assert (tmp_path / "cache" / "n" / "progress.txt").read_text() == "x"


def test_a_commands_opening_settings_reach_its_environment(tables, tmp_path, monkeypatch):
    """``NAME=VALUE`` words that open a run's command set its environment, are not part of
    its argv, and show in the command printed beside the table."""
    monkeypatch.setattr(tables, "CACHE", tmp_path / "cache")
    monkeypatch.setattr(tables, "RECORDS", tmp_path / "records")
    probe = ("KTAE_TABLES_PROBE=on ATEN_CPU_CAPABILITY=default python -c \"import os, pathlib, "
             "sys; pathlib.Path(sys.argv[1], 'env.txt').write_text(os.environ['KTAE_TABLES_PROBE'] "
             "+ ' ' + os.environ['ATEN_CPU_CAPABILITY'])\" {out}")
    monkeypatch.setitem(tables.RUNS, "probe", tables.Run(probe, 1, ("env.txt",)))
    assert tables.command_env("probe") == {"KTAE_TABLES_PROBE": "on",
                                           "ATEN_CPU_CAPABILITY": "default"}
    assert tables.command_argv("probe")[0] == sys.executable
    assert tables.shown("probe").startswith("KTAE_TABLES_PROBE=on ATEN_CPU_CAPABILITY=default "
                                            "python -c ")
    tables.execute("probe", reuse=False, done=set())
    assert (tmp_path / "records" / "probe" / "env.txt").read_text() == "on default"
    # the default job at each kernel level holds every kernel library at that level
    for kernel in tables.KERNEL_ENV:
        settings = tables.command_env(f"train-default-{kernel}")
        assert set(settings) == {"ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                 "MKL_ENABLE_INSTRUCTIONS"}
        assert tables.command_env(f"eval-train-default-{kernel}") == settings
        assert tables.dependencies(f"eval-train-default-{kernel}") == [f"train-default-{kernel}"]


def _speed_record(folder: Path, torch_rows: bool) -> Path:
    rows = {"sort (floor)": {"median_seconds": 1.5, "median_x_sort": 1.0}}
    for key, x, old in (("ktae exact", 0.3, " [sort]"), ("ktae ngram=3", 0.5, " [sort]"),
                        ("prefix-value", 0.7, " [unique]")):
        rows[key] = {"median_x_sort": x, "peak_extra_x_input": x}
        rows[key + old] = {"median_x_sort": 2 * x, "peak_extra_x_input": 2 * x}
        if torch_rows:
            torch_row = " [torch]" if key.startswith("ktae") else " [lcp]"
            rows[key + torch_row] = {"median_x_sort": 1.5 * x, "peak_extra_x_input": x}
    folder.mkdir()
    (folder / "bench.json").write_text(json.dumps({
        "rows": rows, "real_tokens": 29.4e6, "zipf": False, "cpu_capability": "AVX2",
        "threads": 1, "contend": 0, "load_average": [0.2, 0.4], "shape": [1024, 16, 3072],
        "cpu": "AMD EPYC", "cpu_count": 2, "repeats": 5, "preset": "large"}))
    return folder


@pytest.mark.parametrize("torch_rows", [True, False])
def test_speed_tables_show_the_torch_counting_where_it_was_timed(tables, tmp_path, torch_rows):
    folder = _speed_record(tmp_path / "run", torch_rows)
    table = tables.speed(folder)
    summary = tables.speed_summary(folder)
    memory = tables.speed_memory(folder)
    if torch_rows:
        assert "| **0.30x** (0.45x torch, 0.60x sort) | **0.50x** (0.75x torch, 1.00x sort) | " \
               "**0.70x** (1.05x torch, 1.40x unique) |" in table
        assert "| KTAE exact | **0.30x-0.30x** | 0.45x-0.45x | 0.60x-0.60x |" in summary
        assert "| prefix-value | **0.70x-0.70x** | 1.05x-1.05x | 1.40x-1.40x |" in summary
        assert "0.30x (0.30x torch, 0.60x sort)" in memory
    else:
        assert "| **0.30x** (0.60x) | **0.50x** (1.00x) | **0.70x** (1.40x) |" in table
        assert "| KTAE exact | **0.30x-0.30x** | 0.60x-0.60x |" in summary
        assert "without numba" not in summary
