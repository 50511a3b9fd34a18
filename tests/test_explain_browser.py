"""A real browser renders the explain page: headless Chromium takes a screenshot, and the
pixels inside every token box the browser laid out have the colour the HTML gives that
token, for the default view and after switching views. Skips where no Chromium is
installed, except under CI, where that is a failure (``.ci/run`` installs Debian's
``chromium`` or stops)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from test_explain_helpers import byte_level_tokenizer, colours, token_spans

from ktae.core.methods import Method
from ktae.explain.report import build_report
from ktae.groups.input import GroupInput
from ktae.viz.report_html import report_html

WINDOW = (1000, 1800)
BROWSER = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                if shutil.which(b)), None)
#: CI (``CI=true``, or ``KTAE_REQUIRE_BROWSER=1`` from ``.ci/run``) must run these tests: a
#: missing browser fails them there instead of skipping them.
BROWSER_REQUIRED = (os.environ.get("CI", "").lower() in ("true", "1")
                    or os.environ.get("KTAE_REQUIRE_BROWSER") == "1")
pytestmark = pytest.mark.skipif(BROWSER is None and not BROWSER_REQUIRED,
                                reason="no Chromium installed")


@pytest.fixture(autouse=True)
def _browser_present():
    if BROWSER is None:
        pytest.fail("no Chromium (chromium, chromium-browser or google-chrome) on PATH, and CI "
                    "requires the browser tests: install Debian's chromium (.ci/run does)")

RECTS = """<script>
const r = [...document.querySelectorAll('.tok')].map(e => {
  const b = e.getBoundingClientRect(); return [b.left, b.top, b.width, b.height]; });
const pre = document.createElement('pre'); pre.id = 'rects';
pre.textContent = JSON.stringify(r); document.body.appendChild(pre);
</script>"""


def _chromium(tmp_path, url: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
           "--no-first-run", "--disable-background-networking", "--disable-component-update",
           "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--hide-scrollbars",
           "--force-device-scale-factor=1", f"--window-size={WINDOW[0]},{WINDOW[1]}", *extra, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True)


def _screenshot(tmp_path, page_path, name: str) -> np.ndarray:
    from PIL import Image

    shot = tmp_path / name
    _chromium(tmp_path, page_path.as_uri(), f"--screenshot={shot}")
    return np.asarray(Image.open(shot).convert("RGB")).astype(int)


def _rects(tmp_path, page: str) -> list[list[float]]:
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", RECTS + "</body>"), encoding="utf-8")
    dom = _chromium(tmp_path, probe.as_uri(), "--dump-dom").stdout
    return json.loads(re.search(r'<pre id="rects">(.*?)</pre>', dom, re.S).group(1))


def _box_colour(img: np.ndarray, rect) -> tuple[int, int, int] | None:
    """The most common colour inside a token box (its background; the glyph is a minority)."""
    x, y, w, h = rect
    x0, y0, x1, y1 = int(np.ceil(x)) + 1, int(np.ceil(y)) + 1, int(x + w) - 1, int(y + h) - 1
    if x1 - x0 < 2 or y1 - y0 < 4 or y1 >= img.shape[0] or x1 >= img.shape[1]:
        return None
    packed = _packed(img[y0:y1, x0:x1])
    values, counts = np.unique(packed, return_counts=True)
    top = int(values[counts.argmax()])
    return top >> 16, (top >> 8) & 255, top & 255


def _packed(img: np.ndarray) -> np.ndarray:
    """RGB pixels as one int each."""
    return ((img[..., 0] << 16) | (img[..., 1] << 8) | img[..., 2]).reshape(-1)


def _page():
    tok = byte_level_tokenizer()

    def enc(texts):
        return [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in texts]

    groups = [
        GroupInput(prompt="Q: café?", label="first", rewards=[1.0, 0.0, 1.0, 0.0],
                   responses=enc(["un café 😀 \\boxed{42}", "un thé 🤖 zoé", "café 😀 42",
                                  "zoé ça va 🤖"])),
        GroupInput(prompt="Q: sum", label="second", rewards=[1.0, 1.0, 0.0],
                   responses=enc(["the sum is 42", "the answer is \\boxed{42}", "the sum é"])),
    ]
    report = build_report(groups, credit=Method(ignore_token_ids=(0, 1)), tokenizer=tok)
    return report, report_html(report)


def test_screenshot_shows_each_token_in_its_colour(tmp_path):
    report, page = _page()
    spans = token_spans(page)
    rects = _rects(tmp_path, page)
    assert len(rects) == len(spans) == sum(len(r.token_ids) for g in report.groups
                                           for r in g.responses)
    views = [k for k, _ in report.views]
    for view in (report.default_view, "seq"):
        html_page = page
        if view != report.default_view:
            html_page = html_page.replace(" checked>", ">").replace(
                f'id="view-{view}">', f'id="view-{view}" checked>')
        path = tmp_path / f"page-{view}.html"
        path.write_text(html_page, encoding="utf-8")
        img = _screenshot(tmp_path, path, f"shot-{view}.png")
        assert img.shape[:2] == (WINDOW[1], WINDOW[0])
        white = (img == 255).all(axis=2)
        assert white.mean() < 0.98 and len(np.unique(_packed(img))) > 50
        index = views.index(view)
        checked = 0
        for span, rect in zip(spans, rects, strict=True):
            seen = _box_colour(img, rect)
            if seen is None:
                continue
            want = colours(span["style"])[index]
            assert max(abs(a - b) for a, b in zip(seen, want, strict=True)) <= 3, (
                view, span["text"], rect, seen, want)
            checked += 1
        assert checked > 0.9 * len(spans)
        # signed colours appear on screen: reds and blues both present in the token area
        r, b = img[..., 0], img[..., 2]
        assert ((r - b) > 60).sum() > 200 and ((b - r) > 60).sum() > 200


LW_RECTS = """<script>
const box = e => { const b = e.getBoundingClientRect(); return [b.left, b.top, b.width, b.height]; };
const out = {tok: [...document.querySelectorAll('.tok')].map(box),
             lw: [...document.querySelectorAll('.tok .lw')].map(box)};
const pre = document.createElement('pre'); pre.id = 'rects';
pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
</script>"""


def test_screenshot_outlines_the_locally_wrong_characters(tmp_path):
    from ktae.explain.cli import _add_labels
    from ktae.runs.reader import default_tokenizer_path, load_tokenizer

    tok = load_tokenizer(default_tokenizer_path())
    texts = ["37+45=82. 82-18=64. \\boxed{64}", "37+45=72. 72-18=54. \\boxed{54}"]
    groups = [GroupInput(prompt="Q:37+45-18 A:", rewards=[1.0, 0.0],
                         responses=[tok(t, add_special_tokens=False)["input_ids"] for t in texts])]
    _add_labels(groups, tok)
    report = build_report(groups, credit=Method(), tokenizer=tok)
    page = report_html(report)
    probe = tmp_path / "probe.html"
    probe.write_text(page.replace("</body>", LW_RECTS + "</body>"), encoding="utf-8")
    dom = _chromium(tmp_path, probe.as_uri(), "--dump-dom").stdout
    rects = json.loads(re.search(r'<pre id="rects">(.*?)</pre>', dom, re.S).group(1))
    # one character per token: the "7" and the "2" of the forgotten carry, tokens 6 and 7
    # of the second response
    assert len(rects["lw"]) == 2
    path = tmp_path / "page.html"
    path.write_text(page, encoding="utf-8")
    img = _screenshot(tmp_path, path, "shot.png")

    def ring_red(rect) -> list[float]:
        """Share of red pixels on the 2-pixel bands just above and below a box."""
        x, y, w, h = rect
        x0, x1 = int(x) - 1, int(np.ceil(x + w)) + 1
        out = []
        for y0 in (int(y) - 2, int(np.ceil(y + h))):
            part = img[y0:y0 + 2, x0:x1]
            out.append(float(((part[..., 0] > 150) & (part[..., 1] < 90)
                              & (part[..., 2] < 100)).mean()))
        return out

    for rect in rects["lw"]:
        assert min(ring_red(rect)) > 0.2, (rect, ring_red(rect))
    # the same characters of the right answer carry no outline
    for pos in (6, 7):
        assert max(ring_red(rects["tok"][pos])) < 0.05
