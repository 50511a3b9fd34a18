"""Token-credit pictures: HTML content, colours, escaping, PNG output, group selection."""

from __future__ import annotations

import re

import pytest
import torch

from ktae.viz import colour, credit_html, credit_png, group_credit

BG = re.compile(r'background: rgb\((\d+),(\d+),(\d+)\)[^>]*title="advantage ([^" ]+)')


def _backgrounds(page: str) -> dict[float, tuple[int, int, int]]:
    return {float(v): (int(r), int(g), int(b)) for r, g, b, v in BG.findall(page)}


def test_html_shows_every_token_with_hover_values_and_signed_colours():
    responses = [["The", " sum", " is"], ["4", "2", "&"]]
    advantages = [[0.75, -0.5, 0.0], [1.25, -1.25, 0.1]]
    page = credit_html(responses, advantages, rewards=[1.0, 0.0], title="Group <1>")
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page
    assert "Group &lt;1&gt;" in page and "Group <1>" not in page
    for text in ("The", "sum", "is", ">4<", ">2<", "&amp;"):
        assert text in page
    assert page.count('class="ws">\u00b7</span>') == 2  # the two leading spaces
    bg = _backgrounds(page)
    assert set(bg) == {0.75, -0.5, 0.0, 1.25, -1.25, 0.1}
    for v, (r, _, b) in bg.items():
        if v > 0:
            assert r > b, v
        elif v < 0:
            assert b > r, v
        else:
            assert (r, _, b) == (255, 255, 255)
    # symmetric scale: the largest |advantage| gets the end colours
    assert bg[1.25] == (178, 24, 43) and bg[-1.25] == (33, 102, 172)
    assert "reward 1" in page and "correct" in page and "wrong" in page
    assert "legend" in page and "+1.25" in page and "-1.25" in page


def test_html_escapes_script_tokens_quotes_and_newlines():
    page = credit_html([["<script>alert(1)</script>", '"q"', "a\nb", "\t"]],
                       [[0.1, -0.2, 0.3, 0.0]])
    assert "<script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "&quot;q&quot;" in page
    assert "a<span class=\"ws\">\u21b5</span>b" in page
    assert "\u2192" in page


def test_html_from_ids_tensor_and_mask_with_decode():
    ids = torch.tensor([[7, 8, 0], [9, 0, 0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([[0.5, -0.5, 9.0], [0.25, 9.0, 9.0]])
    page = credit_html(ids, adv, mask=mask, decode=lambda i: f"t{i}")
    assert ">t7<" in page and ">t8<" in page and ">t9<" in page and ">t0<" not in page
    assert "token id 7" in page and set(_backgrounds(page)) == {0.5, -0.5, 0.25}
    # without decode the ids themselves are shown, escaped
    assert "&lt;7&gt;" in credit_html([[7]], [[1.0]])


def test_all_zero_advantages_are_white():
    bg = _backgrounds(credit_html([["x", "y"]], [[0.0, 0.0]]))
    assert bg == {0.0: (255, 255, 255)}
    assert colour(3.0, 1.0) == (178, 24, 43)  # clipped beyond the scale


@pytest.mark.parametrize("kwargs, name", [
    (dict(responses=[["a"], ["b"]], advantages=[[0.1]]), "advantages"),
    (dict(responses=[["a", "b"]], advantages=[[0.1]]), "advantages"),
    (dict(responses=[["a"]], advantages=[[float("nan")]]), "advantages"),
    (dict(responses=[["a"]], advantages=[[0.1]], rewards=[1.0, 0.0]), "rewards"),
    (dict(responses=[[1.5]], advantages=[[0.1]]), "responses"),
    (dict(responses="abc", advantages=[[0.1]]), "responses"),
    (dict(responses=[[1]], advantages=[[0.1]], decode="x"), "decode"),
    (dict(responses=torch.tensor([[1, 2]]), advantages=torch.tensor([[0.1, 0.2]]),
          mask=torch.tensor([[1, 1, 1]])), "mask"),
])
def test_bad_input_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}:"):
        credit_html(**kwargs)


def test_png_is_written(tmp_path):
    path = tmp_path / "credit.png"
    credit_png([["$x$", " ", "\n", "<"] * 30, ["a", "b"]],
               [[0.5, -0.5, 0.2, -0.1] * 30, [1.0, -1.0]], path,
               rewards=[1.0, 0.0], max_tokens=40)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 2000
    with pytest.raises(ValueError, match="^max_tokens:"):
        credit_png([["a"]], [[0.1]], tmp_path / "x.png", max_tokens=0)
    with pytest.raises(ValueError, match="^advantages:"):
        credit_png([["a"]], [[0.1, 0.2]], tmp_path / "y.png")
    assert not (tmp_path / "y.png").exists()


def _batch():
    # group "q": token 9 occurs only in its two correct responses; group "r" comes second
    token_ids = torch.tensor([[5, 9, 6, 0], [5, 9, 7, 6], [5, 7, 6, 0], [5, 8, 6, 0],
                              [1, 2, 0, 0], [1, 3, 0, 0]])
    mask = (token_ids != 0).long()
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    group = ["q", "q", "q", "q", "r", "r"]
    return rewards, token_ids, mask, group


def test_group_credit_picks_the_group_and_ranks_the_key_token_first():
    import ktae

    rewards, token_ids, mask, group = _batch()
    data = group_credit(rewards=rewards, token_ids=token_ids, mask=mask, group=group,
                        group_index=0, decode=lambda i: f"w{i}")
    assert data["responses"] == [["w5", "w9", "w6"], ["w5", "w9", "w7", "w6"],
                                 ["w5", "w7", "w6"], ["w5", "w8", "w6"]]
    assert data["rewards"] == [1.0, 1.0, 0.0, 0.0]
    assert data["correct"] == [True, True, False, False]
    rows = data["table_rows"]
    best = max(rows, key=lambda r: r["value"])
    assert best["token"] == 9 and best["text"] == "w9" and best["value"] > 0
    assert (best["a"], best["b"], best["c"], best["d"]) == (2, 0, 0, 2)
    assert sum(r["value"] == best["value"] for r in rows) == 1
    # token 8 (only in one wrong response) gets negative credit; shared tokens get 0
    assert {r["token"]: r["value"] < 0 for r in rows if r["value"]} == {9: False, 8: True}
    # within each correct response the key token carries the largest advantage
    for resp, adv in zip(data["responses"][:2], data["advantages"][:2], strict=True):
        assert resp[adv.index(max(adv))] == "w9"
    assert [abs(r["value"]) for r in rows] == sorted((abs(r["value"]) for r in rows), reverse=True)
    full = ktae.compute_advantages("ktae", rewards=rewards, group=group,
                                   token_ids=token_ids, mask=mask)
    assert data["advantages"][1] == pytest.approx(full[1, :4].tolist())
    assert data["advantages"][0] == pytest.approx(full[0, :3].tolist())
    # the renderers take the dict as is
    page = credit_html(**data)
    assert "<h2>Key tokens</h2>" in page and "<td>w9</td>" in page
    second = group_credit(rewards=rewards, token_ids=token_ids, mask=mask, group=group,
                          group_index=1, top_rows=1)
    assert second["responses"] == [[1, 2], [1, 3]] and len(second["table_rows"]) == 1
    with pytest.raises(ValueError, match="^group_index:"):
        group_credit(rewards=rewards, token_ids=token_ids, mask=mask, group=group, group_index=2)


def test_group_credit_default_is_one_group_and_feeds_png(tmp_path):
    rewards, token_ids, mask, _ = _batch()
    data = group_credit(rewards=rewards[:4], token_ids=token_ids[:4], mask=mask[:4])
    assert len(data["responses"]) == 4
    credit_png(**data, path=tmp_path / "g.png")
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_html_part_does_not_import_matplotlib():
    import subprocess
    import sys

    code = ("import sys, ktae.viz; ktae.viz.credit_html([['a']], [[0.5]]); "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
