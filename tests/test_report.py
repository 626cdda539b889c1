"""``report``: one self-contained HTML page, checked as text and in a real headless browser.

The browser test drives Debian's chromium (``apt-get install -y chromium``) with
playwright; it never downloads a browser. It is skipped only if
``/usr/bin/chromium`` is absent.
"""

from __future__ import annotations

import os
import re
from base64 import b64decode
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from calibration import synthetic_sweep
from phasesweep.analysis import analyze, report
from phasesweep.analysis._analyze import fit_mask
from phasesweep.analysis._report._fits import fit_reason, fit_stats_sql
from phasesweep.analysis._report._page import (
    ReportFigure,
    regime_counts,
    regime_note,
    report_html,
)
from phasesweep.analysis.config import AnalysisConfig
from phasesweep.storage import Store, open_catalog

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


@pytest.mark.heavy
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
    # self-contained: every link is into the page itself (its figures' SVGs as data: URIs)
    hrefs = [a["href"] for t, a in p.tags if "href" in a]
    assert hrefs and all(h.startswith(("data:image/svg+xml;base64,", "#")) for h in hrefs)


def test_fit_notes_say_which_step_of_the_fit_the_runs_missed(page):
    st, path, _ = page
    con = open_catalog(st)
    cfg = AnalysisConfig()
    keys = ["depth", "width"]
    got = con.execute(fit_stats_sql(SWEEP, cfg, keys)).df()
    # the same counts by hand, with the analysis' own filter (analyze's fit_mask)
    df = con.execute(
        "SELECT r.*, s.escape_time, s.regime, s.n_plateaus FROM runs r JOIN summaries s "
        "ON s.sweep = r.sweep AND s.run_id = r.run_id "
        "WHERE r.sweep = ? AND r.status = 'completed'",
        [SWEEP],
    ).df()
    assert len(got) == df.groupby(keys).ngroups == 4
    for (depth, width), g in df.groupby(keys):
        (row,) = got[(got.depth == depth) & (got.width == width)].to_dict("records")
        escaped = g["escape_time"].notna()
        passing = g[fit_mask(g, cfg)]
        assert (row["completed"], row["escaped"]) == (len(g), escaped.sum())
        assert row["in_regimes"] == (escaped & g["regime"].isin(cfg.fit_regimes)).sum()
        assert row["passing"] == len(passing)
        spans = passing.groupby("seed")["init_scale"].agg(lambda a: np.log10(a.max() / a.min()))
        assert row["decades"] == pytest.approx(spans.max(), rel=1e-12)
    # every row without a slope says why, on the page
    text = path.read_text(encoding="utf-8")
    table = text[text.index('id="slope-table"') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr>(.*?)</tr>", table)[1:]
    assert rows
    for r in rows:
        if "no fit" in r:
            assert "no fit: none of the" in r or "runs pass, but no seed" in r, r
    # the reasons, step by step
    stats = {"completed": 10, "escaped": 0, "in_regimes": 0, "plateau": 0, "passing": 0}
    assert fit_reason("log_init_scale", stats, cfg).startswith("none of the 10 completed runs")
    stats |= {"escaped": 6, "in_regimes": 6, "plateau": 0}
    assert fit_reason("log_init_scale", stats, cfg) == (
        "none of the 6 remaining runs left a plateau (analysis.fit_require_plateau)"
    )
    stats |= {"plateau": 4, "passing": 4, "decades": 1.0, "decades_below_1": None}
    assert "4 runs pass, but no seed's init scales span analysis.fit_min_decades = 2 decades" in (
        fit_reason("log_init_scale", stats, cfg)
    )
    assert "(the widest: 1)" in fit_reason("log_init_scale", stats, cfg)
    assert fit_reason("log_log_inv_init_scale", stats, cfg) == (
        "4 runs pass, but no seed has them at two init scales below α = 1"
    )


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
@pytest.mark.heavy
def test_report_in_headless_browser(page, tmp_path):
    from playwright.sync_api import sync_playwright

    _, path, _ = page
    # chromium keeps crash reports and settings under $XDG_CONFIG_HOME and $XDG_CACHE_HOME
    # whatever its profile folder: the test's own, not the home folder
    home = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
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
            env={**os.environ, **home},
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


# --------------------------------------------------------------------------- provenance

PROV_GRID = {"init_scale": [1e-3, 1e-2, 1e-1], "width": [16], "depth": [2, 3], "seed": [0]}
HEADER = "# Provenance test: two chunks on two nodes.\n#\n# Expected: nothing <special>.\n"


@pytest.fixture(scope="module")
def prov_store(tmp_path_factory):
    """Two chunks with known wall times, finish times, devices and nodes."""
    from datetime import datetime, timedelta, timezone

    import pyarrow as pa
    from calibration import synthetic_sweep
    from phasesweep.storage import Store

    st = Store.open(str(tmp_path_factory.mktemp("prov")))
    t0 = datetime(2026, 1, 2, 10, 0, 0, tzinfo=timezone.utc)
    chunks = [  # depth, chunk wall seconds, finished, device, node
        (2, 60.0, t0, "cpu", "node-a"),
        (3, 120.0, t0 + timedelta(minutes=5), "cuda:0", "node-b"),
    ]
    for depth, wall, done, device, node in chunks:
        grid = dict(PROV_GRID, depth=[depth])
        tables = synthetic_sweep(
            init_scales=grid["init_scale"],
            widths=grid["width"],
            depths=grid["depth"],
            seeds=grid["seed"],
            steps=10**5,
        )
        runs = tables["runs"]
        n = runs.num_rows
        for name, values in (
            ("wall_seconds", [wall / n] * n),
            ("chunk_wall_seconds", [wall] * n),
            ("finished_at", [done] * n),
            ("device", [device] * n),
            ("node_id", [node] * n),
            ("run_id", [f"d{depth}-{r}" for r in runs.column("run_id").to_pylist()]),
        ):
            i = runs.schema.get_field_index(name)
            runs = runs.set_column(
                i, runs.schema.field(i), pa.array(values, runs.schema.field(i).type)
            )
        tables["runs"] = runs
        for t in ("trajectories", "layers"):
            ids = [f"d{depth}-{r}" for r in tables[t].column("run_id").to_pylist()]
            i = tables[t].schema.get_field_index("run_id")
            tables[t] = tables[t].set_column(i, "run_id", pa.array(ids, pa.string()))
        st.write_chunk("prov", f"c{depth}", tables)
    spec = {"name": "prov", "description": "provenance <check>", "grid": PROV_GRID}
    st.write_spec("prov", HEADER + yaml.safe_dump(spec))
    return st


@pytest.mark.heavy
def test_report_states_its_provenance(prov_store, tmp_path):
    import subprocess

    from phasesweep.analysis._report._page import duration

    import phasesweep

    launch = {
        "argv": ["phasesweep", "run", "sweeps/prov.yaml", "--set", "train.steps=10"],
        "version": "9.9.9",
        "commit": "abc123",
        "started_at": "2026-01-02T09:59:00Z",
        "finished_at": "2026-01-02T10:05:00Z",
    }
    page = report(
        prov_store,
        "prov",
        tmp_path,
        launch=launch,
        command=["phasesweep", "report", "prov", "--out", "x y"],
    )
    text = page.read_text(encoding="utf-8")
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"],
        cwd=Path(phasesweep.__file__).parent,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert f"{phasesweep.__version__} (commit {head}" in text
    assert "<code>phasesweep report prov --out &#39;x y&#39;</code>" in text
    # the launch's own command line, version and commit
    assert (
        '<code id="launch-argv">phasesweep run sweeps/prov.yaml --set train.steps=10</code>' in text
    )
    assert "phasesweep version 9.9.9, commit abc123" in text
    assert "2026-01-02T09:59:00Z → 2026-01-02T10:05:00Z" in text
    # wall time: 60 + 120 s summed; first start 09:59 (10:00 - 60 s) to last finish 10:05
    assert duration(180.0) == "3 min 00 s" and duration(360.0) == "6 min 00 s"
    assert "3 min 00 s summed over chunks, 6 min 00 s from first start to last finish" in text
    assert "<dd>cpu, cuda:0</dd>" in text and "<dd>node-a, node-b</dd>" in text
    # the spec's header comment and description
    assert "Provenance test: two chunks on two nodes.\n\nExpected: nothing &lt;special&gt;." in text
    assert 'id="description">provenance &lt;check&gt;</p>' in text
    # the SVGs are in the page too (download links), the same as the files beside it
    links = re.findall(
        r'<a download="([^"]+\.svg)" href="data:image/svg\+xml;base64,([^"]+)"', text
    )
    assert links and all((tmp_path / name).read_bytes() == b64decode(data) for name, data in links)
    # the header comment is shown once, above the spec
    assert text.count("Provenance test: two chunks") == 1


@pytest.mark.heavy
def test_report_without_launch_or_git(prov_store, tmp_path, monkeypatch):
    from phasesweep.analysis._report._page import code_commit

    from phasesweep import _version

    outside = tmp_path / "site-packages" / "phasesweep"
    outside.mkdir(parents=True)
    (outside / "_version.py").write_text("")
    monkeypatch.setattr(_version, "__file__", str(outside / "_version.py"))
    assert code_commit() == "unknown"
    text = report(prov_store, "prov", tmp_path / "out").read_text(encoding="utf-8")
    assert "(commit unknown)" in text and "launch-argv" not in text


@pytest.mark.heavy
def test_report_opens_the_catalog_once_and_reads_the_spec_once(prov_store, tmp_path, monkeypatch):
    import phasesweep.storage as storage

    report(prov_store, "prov", tmp_path / "warm")  # analyzed now
    opened, reads = [], []
    real_open, real_read = storage.open_catalog, type(prov_store).read_spec
    monkeypatch.setattr(storage, "open_catalog", lambda *a: opened.append(1) or real_open(*a))
    monkeypatch.setattr(
        type(prov_store), "read_spec", lambda self, s: reads.append(s) or real_read(self, s)
    )
    report(prov_store, "prov", tmp_path / "again")
    assert len(opened) == 1 and reads == ["prov"]


def test_report_omits_empty_tables():
    empty = pd.DataFrame(columns=["x", "runs"])
    html = report_html(
        "s",
        spec_text=None,
        status_counts=pd.DataFrame({"status": ["completed"], "runs": [3]}),
        regime_counts=empty,
        fits=pd.DataFrame(),
        figures=[ReportFigure("f", b"\x89PNG", "cap", None, b"<svg/>")],
        plateau_counts=empty,
    )
    assert 'id="status-counts"' in html
    for gone in ("regime-counts", "plateau-counts", "slope-table", "Fitted slopes"):
        assert gone not in html
    assert '<a download="f.svg" href="data:image/svg+xml;base64,PHN2Zy8+">SVG</a>' in html


#: analysis.at_time of the store of every cause: before the synthetic runs' end (t = 10⁴).
CAUSES_AT = 5000.0


def _tagged(tables: dict, tag: str) -> dict:
    """``tables`` with every run id prefixed by ``tag`` (two chunks' synthetic ids differ)."""
    for name, table in tables.items():
        i = table.schema.get_field_index("run_id")
        ids = [f"{tag}{r}" for r in table["run_id"].to_pylist()]
        tables[name] = table.set_column(i, "run_id", pa.array(ids))
    return tables


def _causes_store(path, *, damage: bool) -> tuple[Store, dict[str, set[str]]]:
    """A store of sweep ``causes`` (``analysis.at_time`` = :data:`CAUSES_AT`) and its runs
    without a regime by cause: two runs added after ``analyze`` are not analyzed; with
    ``damage``, the synthetic sweep's first run failed, and of its converged runs one ends at
    t = 1000 < at_time and one has no finite order parameter."""
    store = Store.open(str(path))
    spec = {"name": "causes", "analysis": {"at_time": CAUSES_AT}}
    store.write_spec("causes", yaml.safe_dump(spec))
    kw = {"widths": (16,), "depths": (2,), "steps": 10**6}
    first = synthetic_sweep(init_scales=(0.5, 1.0), seeds=(0, 1, 2), fail_first=damage, **kw)
    tables = _tagged(first, "a")
    short, nan = "ar000001", "ar000002"  # converged runs (checked: a regime when left alone)
    if damage:
        traj = tables["trajectories"]
        late = pc.and_(pc.equal(traj["run_id"], short), pc.greater(traj["time"], 1000.0))
        traj = traj.filter(pc.invert(late))
        mine = pc.equal(traj["run_id"], nan).to_numpy(zero_copy_only=False)
        for column in ("kernel_distance", "param_rel_change"):
            values = traj[column].to_numpy(zero_copy_only=False).astype(float)
            values[mine] = np.nan
            i = traj.schema.get_field_index(column)
            traj = traj.set_column(i, column, pa.array(values, from_pandas=True))
        tables["trajectories"] = traj
    store.write_chunk("causes", "c0", tables)
    analyze(store, "causes", workers=0)
    added = _tagged(synthetic_sweep(init_scales=(0.5,), seeds=(3, 4), **kw), "b")
    store.write_chunk("causes", "c1", added)
    causes = {"unanalyzed": set(added["runs"]["run_id"].to_pylist())}
    if damage:
        causes |= {"failed": {"ar000000"}, "beyond_at_time": {short}, "not_finite": {nan}}
    return store, causes


def test_every_run_without_a_regime_is_counted_under_its_true_cause(tmp_path):
    store, causes = _causes_store(tmp_path / "damaged", damage=True)
    undamaged, _ = _causes_store(tmp_path / "undamaged", damage=False)
    with open_catalog(undamaged) as con:  # the independent answer: the same runs left alone
        alone = dict(con.execute("SELECT run_id, regime FROM summaries").fetchall())
    assert alone["ar000001"] in ("lazy", "rich") and alone["ar000002"] in ("lazy", "rich")
    with open_catalog(store) as con:
        counts = regime_counts(con, "causes", CAUSES_AT)
        regimes = dict(con.execute("SELECT run_id, regime FROM summaries").fetchall())
        (end,) = con.execute(
            "SELECT max(time) FROM trajectories WHERE run_id = ?", [*causes["beyond_at_time"]]
        ).fetchone()
    assert {r for r, regime in regimes.items() if regime is None} == {
        *causes["failed"],
        *causes["beyond_at_time"],
        *causes["not_finite"],
    }
    none = counts[counts["regime"] == "(none)"].groupby("cause")["runs"].sum().to_dict()
    assert none == {c: len(ids) for c, ids in causes.items()}
    assert counts.loc[counts["regime"] != "(none)", "cause"].isna().all()

    note = regime_note(counts, "causes", CAUSES_AT, store.uri)
    assert note.startswith("(none): 5 runs have no regime. "), note
    analyze_cmd = f"run phasesweep analyze causes --store {store.uri}."
    assert "2 runs not analyzed yet (no current summary" in note and analyze_cmd in note, note
    assert "1 run failed (no trajectory)." in note, note
    assert "1 run beyond analysis.at_time: analysis.at_time = 5000 lies beyond" in note, note
    assert f"of 1 of 5 completed runs (they end by t = {end:.6g})" in note, note
    assert "1 run with a loss or order parameter that is not finite" in note, note
    # the time it offers is one every run with a finite loss reaches, before at_time
    offered = float(re.search(r"reaches t = ([0-9.e+]+):", note).group(1))
    assert offered <= end <= 1000.0 < CAUSES_AT


def test_runs_not_analyzed_yet_are_not_said_to_stop_before_at_time(tmp_path):
    """Issue 32: after a grid was extended, its new runs without a summary were said to end
    before analysis.at_time, beside "every run reaches t = …", which contradicts it."""
    store, causes = _causes_store(tmp_path, damage=False)
    with open_catalog(store) as con:
        counts = regime_counts(con, "causes", CAUSES_AT)
    note = regime_note(counts, "causes", CAUSES_AT)
    assert note == (
        "(none): 2 runs have no regime. 2 runs not analyzed yet (no current summary: new, "
        "extended or retrained since the last analysis): run phasesweep analyze causes."
    )
