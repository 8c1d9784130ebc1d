"""The static leaderboard page in a real browser: headless Chromium runs the page's JS and we read
the resulting DOM back with ``--dump-dom`` (after load, i.e. after the inline script has run).

Sorting is driven by the URL fragment ``#sort=<suite>:<column>:<dir>`` (same code path as header
clicks); header clicks are tested by appending a test-only script to a copy of the page.
Skipped only when /usr/bin/chromium is missing *and* ``CI`` is unset; in CI a missing browser fails.
"""

from __future__ import annotations

import os
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from leaderboards.render import render_html, render_markdown, write_leaderboard
from leaderboards.schema import LeaderboardRecord, make_record

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
EVIL = '<i>evil</i> & "quoted"'


@pytest.fixture(scope="module")
def chromium() -> Path:
    if CHROMIUM.exists():
        return CHROMIUM
    if os.environ.get("CI"):
        pytest.fail(f"{CHROMIUM} is missing in CI: install the Debian package 'chromium'")
    pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium)")


def rec(name: str, suite: str, gsm8k: float, math500: float, algorithm: str = "srpo") -> LeaderboardRecord:
    return make_record(
        suite=suite,
        name=name,
        metrics={"gsm8k": {"avg@4": gsm8k}, "math500": {"avg@4": math500}},
        k=4,
        seeds=[0, 1],
        algorithm=algorithm,
        workflow="solver-verifier",
        model_id="toy-model",
        config={"lr": 1e-6},
        dataset_sha256={"gsm8k": "1" * 64, "math500": "2" * 64},
        version="0.1.0",
        commit="unknown",
        date="2025-03-01T00:00:00Z",
    )


RECORDS = [
    rec("mid", "math", 0.5, 0.3),  # macro 0.40
    rec(EVIL, "math", 0.6, 0.5, algorithm="grpo"),  # macro 0.55
    rec("alpha", "math", 0.7, 0.0, algorithm="mappo"),  # macro 0.35, best on gsm8k
    rec("qa-one", "qa", 0.2, 0.4),
    rec("qa-two", "qa", 0.3, 0.1),
]


class TableReader(HTMLParser):
    """Collect, per ``table.lb``: header keys, aria-sort, data-sort and rows of cell texts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, dict] = {}
        self.root_attrs: dict[str, str | None] = {}
        self._table: dict | None = None
        self._cell: list[str] | None = None
        self._in_head = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "html":
            self.root_attrs = a
        elif tag == "table" and "lb" in (a.get("class") or "").split():
            self._table = {
                "sort": a.get("data-sort"),
                "cols": [],
                "aria": {},
                "rows": [],
                "tags_in_cells": [],
            }
            group = a.get("data-group")
            self.tables[a["data-suite"] + ("/partial" if group == "partial" else "")] = self._table
        elif self._table is None:
            return
        elif tag == "thead":
            self._in_head = True
        elif tag == "tbody":
            self._in_head = False
        elif tag == "th" and self._in_head:
            self._table["cols"].append(a.get("data-col"))
            if a.get("aria-sort"):
                self._table["aria"][a["data-col"]] = a["aria-sort"]
        elif tag == "tr" and not self._in_head:
            self._table["rows"].append({"hash": a.get("data-record"), "cells": []})
        elif tag == "td":
            self._cell = []
        elif self._cell is not None:
            self._table["tags_in_cells"].append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._table is not None:
            self._table["rows"][-1]["cells"].append("".join(self._cell).strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def dump(chromium: Path, page: Path, tmp_path: Path, fragment: str = "") -> TableReader:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    proc = subprocess.run(
        [str(chromium), *FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri() + fragment],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reader = TableReader()
    reader.feed(proc.stdout)
    assert reader.root_attrs.get("data-js") == "ready", "page script did not run"
    return reader


def column(table: dict, col: str) -> list[str]:
    idx = table["cols"].index(col)
    return [row["cells"][idx] for row in table["rows"]]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    return write_leaderboard(RECORDS, out)["html"]


def test_initial_dom_sorted_by_macro_and_escaped(chromium: Path, page: Path, tmp_path: Path) -> None:
    dom = dump(chromium, page, tmp_path)
    assert set(dom.tables) == {"math", "qa"}
    math = dom.tables["math"]
    assert math["cols"][:5] == ["rank", "name", "algorithm", "model", "workflow"]
    assert math["cols"][5:8] == ["ds:gsm8k", "ds:math500", "macro"]
    assert column(math, "name") == [EVIL, "mid", "alpha"]  # record text shown verbatim, as text
    assert column(math, "macro") == ["0.5500", "0.4000", "0.3500"]
    assert column(math, "ds:gsm8k") == ["0.6000", "0.5000", "0.7000"]
    # no <i> element injected from a record name: only the status tag and the record hash
    assert math["tags_in_cells"] == ["span", "code"] * 3
    assert math["aria"] == {"macro": "descending"}
    assert column(dom.tables["qa"], "name") == ["qa-one", "qa-two"]
    hashes = {r.name: r.record_hash for r in RECORDS}
    assert [row["hash"] for row in math["rows"]] == [hashes[EVIL], hashes["mid"], hashes["alpha"]]


@pytest.mark.parametrize(
    ("fragment", "suite", "col", "expected", "other_unchanged"),
    [
        ("#sort=math:macro:asc", "math", "macro", ["alpha", "mid", EVIL], True),
        ("#sort=math:gsm8k:desc", "math", "ds:gsm8k", ["alpha", EVIL, "mid"], True),
        ("#sort=math:ds:math500:asc", "math", "ds:math500", ["alpha", "mid", EVIL], True),
        ("#sort=math:name:asc", "math", "name", [EVIL, "alpha", "mid"], True),  # "<" sorts before letters
        ("#sort=math:algorithm:desc", "math", "algorithm", ["mid", "alpha", EVIL], True),
        ("#sort=qa:macro:asc&sort=math:rank:desc", "qa", "macro", ["qa-two", "qa-one"], False),
    ],
)
def test_hash_sort(chromium, page, tmp_path, fragment, suite, col, expected, other_unchanged) -> None:
    dom = dump(chromium, page, tmp_path, fragment)
    table = dom.tables[suite]
    assert column(table, "name") == expected
    direction = fragment.split("&")[0].rsplit(":", 1)[1]
    assert table["sort"] == f"{col}:{direction}"
    assert table["aria"] == {col: "ascending" if direction == "asc" else "descending"}
    other = dom.tables["qa" if suite == "math" else "math"]
    if other_unchanged:
        assert other["sort"] == "macro:desc"
        assert column(other, "name") == ["qa-one", "qa-two"]
    else:  # second spec: math by rank descending = reverse macro order
        assert column(other, "name") == ["alpha", "mid", EVIL]


def test_bad_hash_leaves_order(chromium, page, tmp_path) -> None:
    dom = dump(
        chromium, page, tmp_path, "#sort=math:nonexistent:asc&sort=nosuite:macro:asc&sort=math:macro:up"
    )
    assert column(dom.tables["math"], "name") == [EVIL, "mid", "alpha"]
    assert dom.tables["math"]["sort"] == "macro:desc"


def test_header_clicks_sort(chromium, tmp_path) -> None:
    html = render_html(RECORDS)
    clicker = """<script>
    (function () {
      var t = document.querySelector('table.lb[data-suite="math"]');
      var th = function (c) { return t.querySelector('th[data-col="' + c + '"]'); };
      th("name").click();                 // text column: first click ascending
      document.documentElement.setAttribute("data-after-one", t.getAttribute("data-sort"));
      th("name").click();                 // second click toggles to descending
      document.documentElement.setAttribute("data-after-two", t.getAttribute("data-sort"));
      document.documentElement.setAttribute("data-names-two", Array.prototype.map.call(
        t.tBodies[0].rows, function (r) { return r.cells[1].textContent; }).join("|"));
      th("ds:math500").click();           // numeric column: first click descending
      th("ds:math500").click();           // second click toggles to ascending
    })();
    </script>
</body>"""
    assert html.count("</body>") == 1
    test_page = tmp_path / "clicks.html"
    test_page.write_text(html.replace("</body>", clicker))
    dom = dump(chromium, test_page, tmp_path)
    assert dom.root_attrs.get("data-after-one") == "name:asc"
    assert dom.root_attrs.get("data-after-two") == "name:desc"
    assert dom.root_attrs.get("data-names-two") == "|".join(["mid", "alpha", EVIL])
    math = dom.tables["math"]
    assert math["sort"] == "ds:math500:asc"
    assert column(math, "ds:math500") == ["0.0000", "0.3000", "0.5000"]
    assert math["aria"] == {"ds:math500": "ascending"}
    assert column(dom.tables["qa"], "name") == ["qa-one", "qa-two"]


# ----------------------------------------------------------------------------- uncertainty and layout

WIDE_DATASETS = ["nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]


def wide(name: str, value: float, std: float, partial: bool = False) -> LeaderboardRecord:
    """A 7-dataset search-suite record with ± over 3 seeds, long names and (optionally) partial coverage."""
    metrics = {ds: {"avg@4": value, "team_tokens_per_problem": 1234.5} for ds in WIDE_DATASETS}
    spread = {ds: {"avg@4": std, "team_tokens_per_problem": 10.0} for ds in WIDE_DATASETS}
    problems = dict.fromkeys(WIDE_DATASETS, 1 if partial else 50)
    return make_record(
        suite="search",
        name=name,
        metrics=metrics,
        metrics_std=spread,
        macro_std={"avg@4": std, "team_tokens_per_problem": 10.0},
        k=4,
        seeds=[0, 1, 2],
        algorithm="srpo-sqrt-normalised",
        workflow="proposers-aggregator",
        model_id="Qwen/Qwen2.5-7B-Instruct-with-a-rather-long-fine-tune-name",
        weights_sha256="ab" * 32,
        config={"lr": 1e-6},
        dataset_sha256={ds: f"{i + 1}" * 64 for i, ds in enumerate(WIDE_DATASETS)},
        evidence={
            "samples_sha256": "cd" * 32,
            "n_samples": sum(problems.values()) * 4 * 3,
            "samples_bytes": 1000,
            "problems": problems,
            "suite_problems": dict.fromkeys(WIDE_DATASETS, 50),
        },
        version="0.1.0",
        commit="unknown",
        date="2025-03-01T00:00:00Z",
    )


WIDE = [
    wide("srpo run with a long descriptive name, seed sweep 0-2", 0.5, 0.01),
    wide("grpo baseline with the same long descriptive name", 0.5, 0.01),
    wide("mappo baseline with the same long descriptive name", 0.5, 0.01),
    wide("within the interval of the top three", 0.48, 0.02),  # 0.50 > 0.49: overlaps 0.49..0.51
    wide("clearly worse", 0.3, 0.01),
    wide("partial: --limit 1", 0.9, 0.0, partial=True),
]
MEASURE = """<script>
(function () {
  var w = window.innerWidth, worst = 0;
  document.querySelectorAll("table.lb").forEach(function (t) {
    worst = Math.max(worst, t.getBoundingClientRect().right, t.scrollWidth + t.getBoundingClientRect().left);
  });
  document.documentElement.setAttribute("data-viewport", String(w));
  document.documentElement.setAttribute("data-table-right", String(Math.ceil(worst)));
  document.documentElement.setAttribute("data-page-width", String(document.documentElement.scrollWidth));
})();
</script>
</body>"""


def test_shared_ranks_intervals_and_1280px_fit(chromium, tmp_path) -> None:
    """Finding (issue 12): equal scores ranked 1, 2, 3; no uncertainty shown; the Model column showed
    a hash instead of a name; the table overflowed a 1280 px window. Fails on 646320c."""
    page = tmp_path / "wide.html"
    page.write_text(render_html(WIDE).replace("</body>", MEASURE))
    profile = tmp_path / "profile-wide"
    proc = subprocess.run(
        [
            str(chromium),
            *FLAGS,
            "--window-size=1280,900",
            f"--user-data-dir={profile}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    dom = TableReader()
    dom.feed(proc.stdout)
    assert dom.root_attrs.get("data-js") == "ready"
    full = dom.tables["search"]
    assert column(full, "rank") == ["1", "1", "1", "1", "5"]  # overlapping intervals share rank 1
    assert column(full, "macro")[0] == "0.5000±0.0100"  # value and ± std over seeds
    assert column(full, "ds:nq")[3] == "0.4800±0.0200"
    assert all(
        cell.startswith("Qwen/Qwen2.5-7B") and cell.endswith("abababab") for cell in column(full, "model")
    )
    assert column(full, "status") == ["unverified"] * 5
    partial = dom.tables["search/partial"]  # ranked apart, although its score is the highest
    assert column(partial, "name") == ["partial: --limit 1"] and column(partial, "rank") == ["1"]
    viewport = int(dom.root_attrs["data-viewport"])
    assert viewport == 1280
    assert int(dom.root_attrs["data-table-right"]) <= viewport
    assert int(dom.root_attrs["data-page-width"]) <= viewport


# ----------------------------------------------------------------------------------- decision table

DECISIONS = {
    "math": [
        {"variant": "grpo", "reference": "srpo", "n_seeds": 10, "delta": -0.012, "low": -0.031, "high": 0.007,
         "p_improvement": 0.41, "verdict": "undecided", "mde": 0.027, "margin": 0.02},
        {"variant": EVIL, "reference": "srpo", "n_seeds": 10, "delta": 0.05, "low": 0.021, "high": 0.079,
         "p_improvement": 0.93, "verdict": "better", "mde": 0.027, "margin": 0.02},
        {"variant": "k1", "reference": "srpo", "n_seeds": 1, "delta": 0.0, "low": None, "high": None,
         "p_improvement": 0.5, "verdict": "undecided", "mde": None, "margin": 0.02},
    ]
}


class DecisionReader(HTMLParser):
    """Rows (cell texts and classes) of every ``table.dec``, keyed by its ``data-decisions`` suite."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: dict[str, list[list[tuple[str, str]]]] = {}
        self._rows: list | None = None
        self._cell: list[str] | None = None
        self._cls = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and "dec" in (a.get("class") or "").split():
            self._rows = self.tables.setdefault(a["data-decisions"] or "", [])
        elif self._rows is not None and tag == "tr" and a.get("data-variant") is not None:
            self._rows.append([])
        elif self._rows is not None and tag == "td":
            self._cell, self._cls = [], a.get("class") or ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._cell is not None and self._rows is not None:
            self._rows[-1].append(("".join(self._cell).strip(), self._cls))
            self._cell = None
        elif tag == "table":
            self._rows = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def test_decision_table_per_suite_in_the_browser(chromium, tmp_path) -> None:
    """Issue 27: the page shows each suite's decisions (Δ, CI, P(A>B), verdict, MDE) under its records,
    escaped, untouched by the sorter, within 1280 px; a screenshot is taken of it."""
    page = tmp_path / "decisions.html"
    page.write_text(render_html(RECORDS, decisions=DECISIONS).replace("</body>", MEASURE))
    proc = subprocess.run(
        [str(chromium), *FLAGS, "--window-size=1280,900", f"--user-data-dir={tmp_path / 'p'}", "--dump-dom",
         page.as_uri() + "#sort=math:name:asc"],
        capture_output=True, text=True, timeout=90, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    dom, dec = TableReader(), DecisionReader()
    dom.feed(proc.stdout)
    dec.feed(proc.stdout)
    assert dom.root_attrs.get("data-js") == "ready"
    assert column(dom.tables["math"], "name") == [EVIL, "alpha", "mid"]  # the records' sorter still works
    assert set(dec.tables) == {"math"}  # only the suite that has decisions
    rows = dec.tables["math"]
    assert [[c for c, _ in r] for r in rows] == [
        ["grpo", "srpo", "-1.2", "[-3.1, +0.7]", "0.41", "undecided", "2.7", "10"],
        [EVIL, "srpo", "+5.0", "[+2.1, +7.9]", "0.93", "better", "2.7", "10"],
        ["k1", "srpo", "+0.0", "[—, —]", "—", "undecided", "—", "1"],
    ]  # order as given (the comparison's), text verbatim, missing numbers (and one seed's P(A>B)) as —
    assert rows[1][5][1] == "better"  # the verdict cell carries its class (colour)
    assert int(dom.root_attrs["data-page-width"]) <= 1280
    shot = tmp_path / "decisions.png"
    proc = subprocess.run(
        [str(chromium), *FLAGS, "--window-size=1280,1400", f"--user-data-dir={tmp_path / 'q'}",
         f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=90, check=False,
    )
    assert proc.returncode == 0 and shot.stat().st_size > 10_000, proc.stderr[-3000:]
    if os.environ.get("SRPO_KEEP_SCREENSHOT"):
        Path(os.environ["SRPO_KEEP_SCREENSHOT"]).write_bytes(shot.read_bytes())


def test_decision_table_in_markdown() -> None:
    md = render_markdown(RECORDS, decisions=DECISIONS)
    math_part = md.split("## qa")[0]
    assert "### Decisions" in math_part and r"| grpo | srpo | -1.2 | \[-3.1, +0.7\] | 0.41 | undecided | 2.7 | 10 |" in md
    assert "inside ±2 pt" in md
    assert "### Decisions" not in md.split("## qa")[1]


# ----------------------------------------------------------------------------------- one seed (issue 52)


def one_seed(name: str, value: float, algorithm: str) -> LeaderboardRecord:
    """A quick-search-like record of one training seed, with evidence (so its ± 0 counts)."""
    problems = {"gsm8k": 50, "math500": 50}
    return make_record(
        suite="quick-search", name=name, metrics={ds: {"avg@4": value} for ds in problems},
        metrics_std={ds: {"avg@4": 0.0} for ds in problems}, macro_std={"avg@4": 0.0}, k=4, seeds=[0],
        algorithm=algorithm, workflow="parallel", model_id="mini-search-worlds-sft", config={"lr": 1e-4},
        dataset_sha256={"gsm8k": "1" * 64, "math500": "2" * 64},
        evidence={"samples_sha256": "cd" * 32, "n_samples": 400, "samples_bytes": 1000, "problems": problems,
                  "suite_problems": problems},
        version="0.1.0", commit="unknown", date="2025-03-01T00:00:00Z",
    )  # fmt: skip


ONE_SEED = [
    one_seed("mappo (mini-search-worlds-sft)", 0.332, "mappo"),
    one_seed("srpo (mini-search-worlds-sft)", 0.328, "srpo"),
    one_seed("grpo (mini-search-worlds-sft)", 0.305, "grpo"),
]
#: the main job's decisions.json as it was written before issue 52: one seed pair's P(A>B) of 0 and 1
ONE_SEED_DECISIONS = {
    "quick-search": [
        {"variant": "grpo", "reference": "srpo", "n_seeds": 1, "delta": -0.023, "low": -0.23, "high": 0.19,
         "p_improvement": 0.0, "verdict": "undecided", "mde": None, "margin": 0.02},
        {"variant": "mappo", "reference": "srpo", "n_seeds": 1, "delta": 0.004, "low": -0.2, "high": 0.21,
         "p_improvement": 1.0, "verdict": "undecided", "mde": None, "margin": 0.02},
    ]
}


def test_one_seed_table_shares_ranks_in_the_browser(chromium, tmp_path) -> None:
    """Issue 52: one training seed ranked 1, 2, 3 (± 0: no interval overlaps) while every decision was
    undecided, and P(A>B) showed 0.00 / 1.00 from one seed pair. Now every row shares rank 1, P(A>B) and
    MDE show —, and the table says in words that it has one seed. A screenshot is kept with
    SRPO_ONE_SEED_SCREENSHOT=PATH."""
    page = tmp_path / "one-seed.html"
    page.write_text(render_html(ONE_SEED, decisions=ONE_SEED_DECISIONS).replace("</body>", MEASURE))
    proc = subprocess.run(
        [str(chromium), *FLAGS, "--window-size=1280,900", f"--user-data-dir={tmp_path / 'p'}", "--dump-dom",
         page.as_uri()],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    dom, dec = TableReader(), DecisionReader()
    dom.feed(proc.stdout)
    dec.feed(proc.stdout)
    assert dom.root_attrs.get("data-js") == "ready"
    table = dom.tables["quick-search"]
    assert column(table, "name")[0].startswith("mappo") and column(table, "rank") == ["1", "1", "1"]
    assert [[c for c, _ in r][4] for r in dec.tables["quick-search"]] == ["—", "—"]  # P(A>B)
    assert [[c for c, _ in r][6] for r in dec.tables["quick-search"]] == ["—", "—"]  # MDE
    assert "Every row has one training seed" in proc.stdout
    # a std over one seed is 0 by construction: no cell claims a measured "±0.0000" spread (page or markdown)
    assert "±0.0000" not in proc.stdout and "±0.0000" not in render_markdown(ONE_SEED)
    assert column(table, "macro")[0] == "0.3320"  # the value alone, no "±0.0000" under it
    shot = tmp_path / "one-seed.png"
    proc = subprocess.run(
        [str(chromium), *FLAGS, "--window-size=1280,1000", f"--user-data-dir={tmp_path / 'q'}",
         f"--screenshot={shot}", page.as_uri()],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and shot.stat().st_size > 10_000, proc.stderr[-3000:]
    if os.environ.get("SRPO_ONE_SEED_SCREENSHOT"):
        Path(os.environ["SRPO_ONE_SEED_SCREENSHOT"]).write_bytes(shot.read_bytes())
