"""Render leaderboards: a markdown file and a self-contained static HTML page.

One table per suite: rows are records, columns are the suite's datasets plus the macro average of
one metric, sorted by macro (best first). The HTML page needs no network -- CSS and a small vanilla
JS sorter are inline and a Content-Security-Policy forbids any fetch -- so it can be opened from disk
or served as a CI artifact. Clicking a header sorts by it; a URL fragment
``#sort=<suite>:<column>:<asc|desc>`` (several joined by ``&``) applies a sort on load, which makes
sorted views linkable and lets tests check the JS in a headless browser. All record text is
HTML-escaped: names and model ids come from submitters.
"""

from __future__ import annotations

import html
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.report import atomic_write_text

from .schema import LeaderboardRecord, is_fraction_metric
from .store import slugify

__all__ = ["choose_metric", "render_html", "render_markdown", "suite_tables", "write_leaderboard"]

_MISSING = "—"


def choose_metric(records: Sequence[LeaderboardRecord]) -> str:
    """The metric a suite is ranked by: the most common of ``avg@<k>``, then ``accuracy``, then
    any shared metric, among the records' macro metrics (ties broken by that preference order).
    """
    if not records:
        raise ValueError("no records")
    prefs: list[str] = []
    for rec in records:
        cand = f"avg@{rec.k}"
        if cand not in prefs:
            prefs.append(cand)
    prefs.append("accuracy")
    prefs += sorted({m for rec in records for m in rec.macro} - set(prefs))
    counts = Counter(m for rec in records for m in rec.macro)
    return max(prefs, key=lambda m: (counts[m], -prefs.index(m)))


@dataclass(frozen=True)
class SuiteTable:
    """A suite's table in display order; ``rows`` hold the records sorted by ``macro`` descending."""

    suite: str
    metric: str
    datasets: list[str]
    rows: list[LeaderboardRecord]


def _sort_key(metric: str):
    def key(rec: LeaderboardRecord) -> tuple[int, float, str, str]:
        value = rec.macro.get(metric)
        return (value is None, -(value if value is not None else 0.0), rec.name, rec.record_hash)

    return key


def suite_tables(records: Iterable[LeaderboardRecord], metric: str | None = None) -> list[SuiteTable]:
    """Group records by suite (sorted by suite name) and order each group by macro, best first."""
    by_suite: dict[str, list[LeaderboardRecord]] = {}
    for rec in records:
        by_suite.setdefault(rec.suite, []).append(rec)
    tables = []
    for suite in sorted(by_suite):
        recs = by_suite[suite]
        chosen = metric if metric is not None else choose_metric(recs)
        datasets = sorted({ds for rec in recs for ds in rec.metrics})
        tables.append(SuiteTable(suite, chosen, datasets, sorted(recs, key=_sort_key(chosen))))
    return tables


def _fmt(metric: str, value: float | None) -> str:
    if value is None:
        return _MISSING
    return f"{value:.4f}" if is_fraction_metric(metric) else f"{value:.6g}"


def _model(rec: LeaderboardRecord) -> str:
    prov = rec.provenance
    return prov.model_id if prov.model_id is not None else f"weights:{(prov.weights_sha256 or '')[:12]}"


def _date(rec: LeaderboardRecord) -> str:
    return rec.provenance.date[:10]


def _md_text(text: str) -> str:
    """Escape for a markdown table cell: HTML specials, markdown emphasis/link syntax and pipes."""
    text = html.escape(text.replace("\r", " ").replace("\n", " "), quote=False)
    for ch in "\\`*_[]|":
        text = text.replace(ch, "\\" + ch)
    return text


def render_markdown(records: Iterable[LeaderboardRecord], metric: str | None = None) -> str:
    """Markdown with one section and table per suite (columns: rank, name, algorithm, model,
    workflow, datasets..., macro, k, seeds, date, record hash)."""
    tables = suite_tables(records, metric)
    lines = ["# Leaderboard", ""]
    if not tables:
        return "\n".join(lines + ["No records.", ""])
    for tab in tables:
        lines += [f"## {_md_text(tab.suite)}", "", f"Ranked by macro `{tab.metric}` over datasets.", ""]
        head = ["#", "Name", "Algorithm", "Model", "Workflow", *[_md_text(d) for d in tab.datasets]]
        head += [f"Macro {_md_text(tab.metric)}", "k", "Seeds", "Date", "Record"]
        lines.append("| " + " | ".join(head) + " |")
        lines.append(
            "|" + "|".join(["---:"] + [":---"] * 4 + ["---:"] * (len(tab.datasets) + 3) + [":---"] * 2) + "|"
        )
        for rank, rec in enumerate(tab.rows, start=1):
            cells = [str(rank), _md_text(rec.name), _md_text(rec.provenance.algorithm), _md_text(_model(rec))]
            cells.append(_md_text(rec.provenance.workflow))
            cells += [_fmt(tab.metric, rec.metrics.get(ds, {}).get(tab.metric)) for ds in tab.datasets]
            cells += [_fmt(tab.metric, rec.macro.get(tab.metric)), str(rec.k), str(len(rec.seeds))]
            cells += [_md_text(_date(rec)), f"`{rec.short_hash}`"]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:80rem;padding:0 1rem;color:#1f2328}
h1{font-size:1.6rem}h2{font-size:1.25rem;margin-top:2rem}
.note,.meta{color:#59636e;font-size:.9rem}
table.lb{border-collapse:collapse;width:100%;font-size:.9rem}
table.lb th,table.lb td{border-bottom:1px solid #d1d9e0;padding:.35rem .6rem;text-align:left;white-space:nowrap}
table.lb td.num,table.lb th[data-type=num]{text-align:right;font-variant-numeric:tabular-nums}
table.lb th{cursor:pointer;user-select:none;background:#f6f8fa;position:sticky;top:0}
table.lb th:focus{outline:2px solid #0969da}
table.lb th[aria-sort=ascending]::after{content:" \\25B2"}
table.lb th[aria-sort=descending]::after{content:" \\25BC"}
table.lb tbody tr:hover{background:#f6f8fa}
code{font-size:.85rem}
""".strip()

# Kept small and dependency-free; sortTable is shared by header clicks and the URL fragment.
_JS = """
(function () {
  "use strict";
  function key(cell, type) {
    var v = cell.getAttribute("data-value");
    if (type === "num") {
      if (v === null || v === "") { return null; }
      var x = parseFloat(v);
      return isNaN(x) ? null : x;
    }
    return (v !== null ? v : cell.textContent).toLowerCase();
  }
  function sortTable(table, col, dir) {
    var ths = table.tHead.rows[0].cells, idx = -1, type = "text", i, names = [col, "ds:" + col];
    for (var p = 0; p < names.length && idx < 0; p++) {
      for (i = 0; i < ths.length; i++) {
        if (ths[i].getAttribute("data-col") === names[p]) { idx = i; col = names[p]; }
      }
    }
    if (idx >= 0) { type = ths[idx].getAttribute("data-type"); }
    if (idx < 0 || (dir !== "asc" && dir !== "desc")) { return false; }
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows).map(function (r, n) {
      return {row: r, k: key(r.cells[idx], type), n: n};
    });
    rows.sort(function (a, b) {
      if (a.k === null || b.k === null) { return a.k === b.k ? a.n - b.n : (a.k === null ? 1 : -1); }
      var c = a.k < b.k ? -1 : (a.k > b.k ? 1 : 0);
      if (dir === "desc") { c = -c; }
      return c !== 0 ? c : a.n - b.n;
    });
    rows.forEach(function (r) { body.appendChild(r.row); });
    for (i = 0; i < ths.length; i++) { ths[i].removeAttribute("aria-sort"); }
    ths[idx].setAttribute("aria-sort", dir === "desc" ? "descending" : "ascending");
    table.setAttribute("data-sort", col + ":" + dir);
    return true;
  }
  function tableFor(suite) {
    var tables = document.querySelectorAll("table.lb");
    for (var i = 0; i < tables.length; i++) {
      if (tables[i].getAttribute("data-suite") === suite) { return tables[i]; }
    }
    return null;
  }
  function applyHash() {
    var parts = window.location.hash.replace(/^#/, "").split("&");
    parts.forEach(function (part) {
      if (part.indexOf("sort=") !== 0) { return; }
      var spec;
      try { spec = decodeURIComponent(part.slice(5)).split(":"); } catch (e) { return; }
      if (spec.length < 3) { return; }
      var table = tableFor(spec[0]);
      if (table) { sortTable(table, spec.slice(1, -1).join(":"), spec[spec.length - 1]); }
    });
  }
  function onHeader(table, th) {
    var cur = th.getAttribute("aria-sort"), col = th.getAttribute("data-col"), dir;
    if (cur === "descending") { dir = "asc"; }
    else if (cur === "ascending") { dir = "desc"; }
    else { dir = th.getAttribute("data-type") === "num" ? "desc" : "asc"; }
    if (sortTable(table, col, dir) && window.history && window.history.replaceState) {
      var spec = encodeURIComponent(table.getAttribute("data-suite") + ":" + col + ":" + dir);
      try { window.history.replaceState(null, "", "#sort=" + spec); } catch (e) { /* file:// quirks */ }
    }
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.lb"), function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th) {
      th.addEventListener("click", function () { onHeader(table, th); });
      th.addEventListener("keydown", function (ev) {
        if (ev.key === "Enter" || ev.key === " ") { ev.preventDefault(); onHeader(table, th); }
      });
    });
  });
  applyHash();
  window.addEventListener("hashchange", applyHash);
  document.documentElement.setAttribute("data-js", "ready");
})();
""".strip()

_CSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:"


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _th(col: str, label: str, num: bool, sorted_desc: bool = False) -> str:
    aria = ' aria-sort="descending"' if sorted_desc else ""
    kind = "num" if num else "text"
    return f'<th scope="col" tabindex="0" data-col="{_e(col)}" data-type="{kind}"{aria}>{_e(label)}</th>'


def _td_num(metric: str, value: float | None) -> str:
    raw = "" if value is None else repr(float(value))
    return f'<td class="num" data-value="{raw}">{_e(_fmt(metric, value))}</td>'


def _td_text(text: str, title: str | None = None) -> str:
    tip = f' title="{_e(title)}"' if title else ""
    return f"<td{tip}>{_e(text)}</td>"


def _html_table(tab: SuiteTable) -> str:
    heads = [
        _th("rank", "#", True),
        _th("name", "Name", False),
        _th("algorithm", "Algorithm", False),
        _th("model", "Model", False),
        _th("workflow", "Workflow", False),
        *[_th(f"ds:{ds}", ds, True) for ds in tab.datasets],
        _th("macro", f"Macro {tab.metric}", True, sorted_desc=True),
        _th("k", "k", True),
        _th("seeds", "Seeds", True),
        _th("date", "Date", False),
        _th("record", "Record", False),
    ]
    rows = []
    for rank, rec in enumerate(tab.rows, start=1):
        prov = rec.provenance
        extra = [f"commit {prov.git_commit}", f"version {prov.package_version}", f"config {prov.config_hash}"]
        if prov.retriever:
            extra.append(f"retriever {prov.retriever}")
        if prov.corpus:
            extra.append(f"corpus {prov.corpus}")
        cells = [
            f'<td class="num" data-value="{rank}">{rank}</td>',
            _td_text(rec.name),
            _td_text(prov.algorithm),
            _td_text(_model(rec), prov.weights_sha256),
            _td_text(prov.workflow),
            *[_td_num(tab.metric, rec.metrics.get(ds, {}).get(tab.metric)) for ds in tab.datasets],
            _td_num(tab.metric, rec.macro.get(tab.metric)),
            f'<td class="num" data-value="{rec.k}">{rec.k}</td>',
            f'<td class="num" data-value="{len(rec.seeds)}" title="{_e(rec.seeds)}">{len(rec.seeds)}</td>',
            f'<td data-value="{_e(prov.date)}" title="{_e(prov.date)}">{_e(_date(rec))}</td>',
            f'<td title="{_e(chr(10).join([rec.record_hash, *extra]))}"><code>{_e(rec.short_hash)}</code></td>',
        ]
        rows.append(f'<tr data-record="{_e(rec.record_hash)}">' + "".join(cells) + "</tr>")
    return (
        f'<table class="lb" data-suite="{_e(tab.suite)}" data-metric="{_e(tab.metric)}" data-sort="macro:desc">'
        f"<thead><tr>{''.join(heads)}</tr></thead>\n<tbody>\n" + "\n".join(rows) + "\n</tbody></table>"
    )


def render_html(
    records: Iterable[LeaderboardRecord], metric: str | None = None, title: str = "srpo leaderboard"
) -> str:
    """A complete, self-contained HTML page (inline CSS/JS, no external resources).

    Dataset columns are keyed ``ds:<dataset>`` in ``data-col`` (so a dataset called ``macro`` cannot
    clash with the macro column); the URL fragment also accepts the bare dataset name when it does
    not clash. Other keys: rank, name, algorithm, model, workflow, macro, k, seeds, date, record.
    """
    tables = suite_tables(records, metric)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>\n{_CSS}\n</style>",
        "</head>",
        "<body>",
        f"<h1>{_e(title)}</h1>",
        '<p class="note">Click a column header to sort; link a sorted view with '
        "<code>#sort=&lt;suite&gt;:&lt;column&gt;:asc|desc</code>.</p>",
    ]
    if not tables:
        parts.append("<p>No records.</p>")
    else:
        links = " · ".join(
            f'<a href="#suite-{i}-{slugify(t.suite)}">{_e(t.suite)}</a>' for i, t in enumerate(tables)
        )
        parts.append(f"<nav>{links}</nav>")
    for i, tab in enumerate(tables):
        parts += [
            f'<section id="suite-{i}-{slugify(tab.suite)}" data-suite="{_e(tab.suite)}">',
            f"<h2>{_e(tab.suite)}</h2>",
            f'<p class="meta">Ranked by macro <code>{_e(tab.metric)}</code> over '
            f"{len(tab.datasets)} dataset(s); {len(tab.rows)} record(s).</p>",
            _html_table(tab),
            "</section>",
        ]
    parts += [f"<script>\n{_JS}\n</script>", "</body>", "</html>", ""]
    return "\n".join(parts)


def write_leaderboard(
    records: Iterable[LeaderboardRecord],
    out_dir: str | os.PathLike[str],
    metric: str | None = None,
    title: str = "srpo leaderboard",
) -> dict[str, Path]:
    """Atomically write ``leaderboard.md`` and ``leaderboard.html`` into ``out_dir``."""
    records = list(records)
    out = Path(out_dir)
    return {
        "md": atomic_write_text(out / "leaderboard.md", render_markdown(records, metric)),
        "html": atomic_write_text(out / "leaderboard.html", render_html(records, metric, title)),
    }
