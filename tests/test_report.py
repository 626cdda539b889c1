"""``report``: one self-contained HTML page, checked as text and in a real headless browser.

The browser test drives Debian's chromium (``apt-get install -y chromium``) with
playwright; it never downloads a browser. It is skipped only if
``/usr/bin/chromium`` is absent.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
from phasesweep.analysis import report
from phasesweep.analysis.report import ReportFigure, report_html
from phasesweep.storage import open_catalog

SWEEP = "rep"
CHROMIUM = Path("/usr/bin/chromium")
GRID = {
    "init_scale": [1e-3, 1e-2, 1e-1, 1.0, 3.0],
    "width": [16, 256],
    "depth": [2, 3],
    "seed": [0, 1],
}


@pytest.fixture(scope="module")
def page(tmp_path_factory, synthetic_store):
    st, spec_text = synthetic_store(
        SWEEP, GRID, description="report <test> & escaping", fail_first=True
    )
    out = tmp_path_factory.mktemp("report")
    path = report(st, SWEEP, out)
    return st, path, spec_text


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))


def test_report_is_self_contained(page):
    st, path, spec_text = page
    assert path.name == "report.html" and path.exists()
    text = path.read_text(encoding="utf-8")
    p = _Collect()
    p.feed(text)
    imgs = [a for t, a in p.tags if t == "img"]
    assert len(imgs) == 4  # phase diagram, escape time, loss curves, singular values
    assert all(a["src"].startswith("data:image/png;base64,") for a in imgs)
    # nothing is fetched from elsewhere: no src/href to a URL, no script, no stylesheet link
    for tag, attrs in p.tags:
        assert tag not in ("script", "link", "iframe")
        for k in ("src", "href"):
            assert not re.match(r"^(https?:|//|file:)", attrs.get(k, ""))
    # the spec, escaped, in a <pre>
    assert "report &lt;test&gt; &amp; escaping" in text
    assert 'id="spec"' in text
    # counts: by status (the failed and diverged runs) and by regime
    con = open_catalog(st)
    n = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    n_div = con.execute("SELECT count(*) FROM runs WHERE status = 'diverged'").fetchone()[0]
    assert f"<td>{n - n_div - 1}</td>" in text  # completed
    assert f"<td>{n_div}</td>" in text and "<td>1</td>" in text
    assert 'id="regime-counts"' in text and ">diverged</td>" in text
    # the phase diagram's query is on the page
    assert "FROM runs AS r" in text and "LEFT JOIN summaries AS s" in text


def test_report_html_from_parts_escapes_and_tables():
    fits = pd.DataFrame(
        [
            {
                "depth": 3,
                "x": "log_init_scale",
                "y": "log_escape_time",
                "slope": -1.02,
                "ci_low": -1.1,
                "ci_high": -0.95,
                "theory_slope": -1.0,
                "theory": "t ∝ α^-1",
                "n_points": 15,
                "n_seeds": 3,
                "confidence": 0.95,
                "ci_method": "seeds_t",
                "width": 64,
                "activation": None,
                "noise_sigma": None,
                "lr": None,
            }
        ]
    )
    html = report_html(
        "s",
        spec_text="name: s\n# <b>",
        status_counts=pd.DataFrame({"status": ["completed"], "runs": [3]}),
        regime_counts=pd.DataFrame({"regime": ["rich"], "runs": [3]}),
        fits=fits,
        figures=[ReportFigure("f", b"\x89PNG", "cap <x>", "SELECT 1")],
    )
    assert "# &lt;b&gt;" in html and "cap &lt;x&gt;" in html
    assert "log t vs log α" in html and "-1.02" in html and "[-1.1, -0.95]" in html
    assert "width 64" in html and html.count("<tr>") == 1 + 1 + 1 + 1 + 1 + 1


@pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="needs Debian chromium at /usr/bin/chromium "
    "(apt-get install -y chromium); playwright never downloads one here",
)
def test_report_in_headless_browser(page):
    from playwright.sync_api import sync_playwright

    _, path, _ = page
    errors: list[str] = []
    failed: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 900})
            tab.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.on("requestfailed", lambda r: failed.append(r.url[:80]))
            tab.goto(path.as_uri(), wait_until="load")
            images = tab.evaluate(
                "() => Array.from(document.images).map(i => "
                "({ok: i.complete && i.naturalWidth > 0, w: i.naturalWidth, h: i.naturalHeight,"
                " shown: i.getBoundingClientRect().width}))"
            )
            slope_rows = tab.locator("#slope-table tbody tr").count()
            status_rows = tab.locator("#status-counts tbody tr").count()
            spec = tab.locator("#spec").inner_text()
            title = tab.title()
            width = tab.evaluate("() => document.documentElement.scrollWidth")
        finally:
            browser.close()
    assert len(images) == 4
    assert all(i["ok"] for i in images), images
    assert all(i["w"] > 300 and i["h"] > 200 and i["shown"] > 200 for i in images), images
    assert slope_rows >= 4  # depth 2: three fits, depth 3: one, per width
    assert status_rows == 3  # completed, diverged, failed
    assert "report <test> & escaping" in spec
    assert title == f"phasesweep report — {SWEEP}"
    assert width <= 1280  # no horizontal overflow: figures scale to the page
    assert errors == [] and failed == []
