"""Render leaderboards: a markdown file and a self-contained static HTML page.

One table per suite: rows are records, columns are the suite's datasets plus the macro average of
one metric, sorted by macro (best first). Each cell shows ``± std over seeds`` when the record
carries it, and ranks follow the evidence (:func:`evidence_ranks`): a row's rank is 1 + the number of
rows shown to be better than it. Where the suite has a paired decision table (``srpo bench compare``'s
decisions, the same paired intervals), a row is better than another only when their decision says so;
two rows of that comparison without a decided difference share a rank. Elsewhere a row is better when
its interval (value ± std over seeds) lies entirely above the other's, and never when either has one
training seed (a single seed has no spread to show: one seed gives no strict ranks). Records that do
not cover the whole suite (``--limit``, ``--dataset``) are *partial* and ranked apart, in their own
table below the suite's.

The HTML page needs no network -- CSS and a small vanilla JS sorter are inline and a
Content-Security-Policy forbids any fetch -- so it can be opened from disk or served as a CI
artifact. Clicking a header sorts by it; a URL fragment ``#sort=<suite>:<column>:<asc|desc>``
(several joined by ``&``) applies a sort on load, which makes sorted views linkable and lets tests
check the JS in a headless browser. All record text is HTML-escaped: names and model ids come from
submitters. The table is laid out to fit a 1280 px window: long names wrap, hashes are shortened
(full values in tooltips).
"""

from __future__ import annotations

import html
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from srpo_common import atomic_write_text

from .schema import LeaderboardRecord, is_fraction_metric
from .store import slugify

__all__ = [
    "choose_metric",
    "evidence_ranks",
    "interval_ranks",
    "render_html",
    "render_markdown",
    "suite_tables",
    "write_leaderboard",
]

_MISSING = "—"
#: Per record hash, the tags shown in the Status column (``verified``/``unverified``, ``reproduced M/N
#: (seed S)``: M samples re-generated exactly of the record's N, with seed S); a tag's first word is its
#: CSS class.
Status = Mapping[str, Sequence[str]]
#: Per suite, the decision rows of a comparison (``decisions.json`` of ``srpo bench compare``): each a
#: mapping with variant, reference, n_seeds, delta, low, high, p_improvement, verdict, mde, margin
#: (macro score units; None where undefined) and, when the comparison's records are on the page,
#: variant_record / reference_record (their record hashes; else rows are matched by name). Plain data:
#: this package imports no benchmark code.
Decisions = Mapping[str, Sequence[Mapping[str, object]]]
#: A decision's verdicts that order its two rows (variant vs reference); any other verdict leaves them tied.
_ORDERING = {"better": 1, "worse": -1}
#: The start model's name in decision rows (``benchmarks.decide.START``); its record is named ``start (...)``.
_START_VARIANT = "start (SFT)"


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


def _macro_std(rec: LeaderboardRecord, metric: str) -> float:
    """The ± a rank uses: only from records with evidence, where ``validate`` recomputed it from the
    samples (a record without evidence could claim a huge spread to share the top rank)."""
    if rec.evidence is None:
        return 0.0
    return (rec.macro_std or {}).get(metric, 0.0)


def _cell_std(rec: LeaderboardRecord, ds: str | None, metric: str) -> float | None:
    """The ``± std over seeds`` a cell shows (``ds`` None: the macro column); None, shown as no spread,
    when the record has none or has one seed: a standard deviation over one seed is 0 by construction
    and would read as a measured, perfectly stable result."""
    if _n_seeds(rec) < 2:
        return None
    if ds is None:
        return None if rec.macro_std is None else rec.macro_std.get(metric)
    if rec.metrics_std is None:
        return None
    return rec.metrics_std.get(ds, {}).get(metric)


def interval_ranks(values: Sequence[tuple[float | None, float]]) -> list[int | None]:
    """Ranks of ``(value, std)`` pairs, higher is better: 1 + the number of values whose interval
    ``[v - std, v + std]`` lies entirely above this one's. Overlapping intervals (equal values
    included) share a rank; a missing value gets ``None``."""
    ranks: list[int | None] = []
    for v, sd in values:
        if v is None:
            ranks.append(None)
            continue
        better = sum(1 for w, sw in values if w is not None and w - sw > v + sd)
        ranks.append(1 + better)
    return ranks


def _n_seeds(rec: LeaderboardRecord) -> int:
    return len(rec.seeds)


def _matches(rec: LeaderboardRecord, variant: object, record_hash: object) -> bool:
    """Whether decision row side ``variant`` (with its record hash, when known) is this record: by hash,
    else by the comparison's naming (``<variant> (<model>)``, the start model ``start (<model>)``)."""
    if isinstance(record_hash, str) and record_hash:
        return rec.record_hash == record_hash
    if not isinstance(variant, str) or not variant:
        return False
    label = "start" if variant == _START_VARIANT else variant
    return rec.name == label or rec.name.startswith(label + " (")


def evidence_ranks(
    rows: Sequence[LeaderboardRecord],
    metric: str,
    decisions: Sequence[Mapping[str, object]] = (),
) -> list[int | None]:
    """Ranks of ``rows`` (higher ``metric`` is better): 1 + the number of rows shown to be better.

    Row A is shown better than row B when a paired decision between them says so (``better``/``worse``
    verdicts: their paired interval excludes 0); when both are rows of the decision table but no decision
    orders them (undecided, equivalent, or a pair the table does not compare), they share. Rows outside
    the decision table fall back to :func:`interval_ranks`' rule (A's interval entirely above B's), but
    only when both have two training seeds or more: one seed has no spread, so it never wins nor loses a
    strict rank without a paired decision. A row without a value gets ``None``.
    """
    sides: list[tuple[list[int], list[int], int]] = []  # (variant rows, reference rows, +1/-1)
    in_table: set[int] = set()
    for d in decisions:
        va = [i for i, r in enumerate(rows) if _matches(r, d.get("variant"), d.get("variant_record"))]
        rb = [i for i, r in enumerate(rows) if _matches(r, d.get("reference"), d.get("reference_record"))]
        in_table.update(va + rb)
        order = _ORDERING.get(str(d.get("verdict")), 0)
        if order and va and rb:
            sides.append((va, rb, order))
    values = [r.macro.get(metric) for r in rows]
    stds = [_macro_std(r, metric) for r in rows]

    def better(a: int, b: int) -> bool:
        if values[a] is None or values[b] is None:
            return False
        paired = [o for va, rb, o in sides if a in va and b in rb]
        paired += [-o for va, rb, o in sides if b in va and a in rb]
        if paired or (a in in_table and b in in_table):
            return any(o > 0 for o in paired) and not any(o < 0 for o in paired)
        if min(_n_seeds(rows[a]), _n_seeds(rows[b])) < 2:
            return False
        return values[a] - stds[a] > values[b] + stds[b]  # type: ignore[operator]

    return [
        None if values[i] is None else 1 + sum(1 for j in range(len(rows)) if j != i and better(j, i))
        for i in range(len(rows))
    ]


def one_seed_note(rows: Sequence[LeaderboardRecord]) -> str | None:
    """The sentence a table with one-seed rows carries (None when every row has two seeds or more)."""
    ones = sum(1 for r in rows if _n_seeds(r) < 2)
    if not ones:
        return None
    who = "Every row has" if ones == len(rows) else f"{ones} of {len(rows)} rows have"
    return (
        f"{who} one training seed: a single seed cannot tell a real difference from training noise, so "
        "these rows share their rank unless a paired decision separates them, and P(A>B) and MDE (which "
        "need two seeds or more) show —."
    )


@dataclass(frozen=True)
class SuiteTable:
    """A suite's table in display order; ``rows`` hold the full-suite records sorted by ``macro``
    descending with their ``ranks``; ``protocols`` the full records of each registered protocol of the
    suite (a fixed smaller problem set, such as the main job's), ``(name, rows, ranks)`` ranked among
    themselves; ``partial`` the partial records, ranked among themselves."""

    suite: str
    metric: str
    datasets: list[str]
    rows: list[LeaderboardRecord]
    ranks: list[int | None] = field(default_factory=list)
    partial: list[LeaderboardRecord] = field(default_factory=list)
    partial_ranks: list[int | None] = field(default_factory=list)
    protocols: list[tuple[str, list[LeaderboardRecord], list[int | None]]] = field(default_factory=list)


def _sort_key(metric: str):
    def key(rec: LeaderboardRecord) -> tuple[int, float, str, str]:
        value = rec.macro.get(metric)
        return (value is None, -(value if value is not None else 0.0), rec.name, rec.record_hash)

    return key


def _ranked(
    recs: list[LeaderboardRecord], metric: str, decisions: Sequence[Mapping[str, object]] = ()
) -> tuple[list[LeaderboardRecord], list[int | None]]:
    rows = sorted(recs, key=_sort_key(metric))
    return rows, evidence_ranks(rows, metric, decisions)


def suite_tables(
    records: Iterable[LeaderboardRecord], metric: str | None = None, decisions: Decisions | None = None
) -> list[SuiteTable]:
    """Group records by suite (sorted by suite name), order each group by macro, best first, and rank
    full-suite and partial records separately (:func:`evidence_ranks`, with the suite's ``decisions``)."""
    by_suite: dict[str, list[LeaderboardRecord]] = {}
    for rec in records:
        by_suite.setdefault(rec.suite, []).append(rec)
    tables = []
    for suite in sorted(by_suite):
        recs = by_suite[suite]
        chosen = metric if metric is not None else choose_metric(recs)
        datasets = sorted({ds for rec in recs for ds in rec.metrics})
        full: dict[str | None, list[LeaderboardRecord]] = {}
        for r in recs:
            if not r.partial:
                full.setdefault(_protocol(r), []).append(r)
        dec = (decisions or {}).get(suite) or ()
        rows, ranks = _ranked(full.pop(None, []), chosen, dec)
        partial, partial_ranks = _ranked([r for r in recs if r.partial], chosen)
        protocols = [(p, *_ranked(full[p], chosen, dec)) for p in sorted(full)]
        tables.append(SuiteTable(suite, chosen, datasets, rows, ranks, partial, partial_ranks, protocols))
    return tables


def _protocol(rec: LeaderboardRecord) -> str | None:
    return rec.evidence.protocol if rec.evidence is not None else None


def _protocol_title(name: str, rows: list[LeaderboardRecord]) -> str:
    per = sorted({n for r in rows if r.evidence is not None for n in r.evidence.suite_problems.values()})
    size = f"the first {per[0]} problems of each dataset" if len(per) == 1 else "a fixed problem set"
    return f"Protocol {name} ({size}; ranked apart from the whole suite)"


def _fmt(metric: str, value: float | None) -> str:
    if value is None:
        return _MISSING
    return f"{value:.4f}" if is_fraction_metric(metric) else f"{value:.6g}"


def _fmt_pm(metric: str, std: float | None) -> str:
    """The ``± std`` part of a cell; empty when the record has no spread for it."""
    if std is None:
        return ""
    return f"±{std:.4f}" if is_fraction_metric(metric) else f"±{std:.3g}"


def _model(rec: LeaderboardRecord) -> str:
    """The model's name; a record that names none shows a dash (its weights hash is shown beside)."""
    return rec.provenance.model_id if rec.provenance.model_id is not None else _MISSING


def _weights(rec: LeaderboardRecord) -> str:
    w = rec.provenance.weights_sha256
    return w[:8] if w else ""


def _date(rec: LeaderboardRecord) -> str:
    return rec.provenance.date[:10]


def _tag_class(tag: str) -> str:
    """A Status tag's CSS class: its first word (``reproduced 96/96 (seed 7)`` -> ``reproduced``)."""
    return (tag.split() or [""])[0]


def _status(rec: LeaderboardRecord, status: Status | None) -> list[str]:
    if status is not None and rec.record_hash in status:
        return list(status[rec.record_hash])
    return ["unverified"]


def _coverage(rec: LeaderboardRecord) -> str:
    ev = rec.evidence
    if ev is None:
        return ""
    covered = f"{sum(ev.problems.values())}/{sum(ev.suite_problems.values())} problems"
    return covered if ev.protocol is None else f"{covered} of protocol {ev.protocol}"


def _md_text(text: str) -> str:
    """Escape for a markdown table cell: HTML specials, markdown emphasis/link syntax and pipes."""
    text = html.escape(text.replace("\r", " ").replace("\n", " "), quote=False)
    for ch in "\\`*_[]|":
        text = text.replace(ch, "\\" + ch)
    return text


def _md_rows(
    tab: SuiteTable, rows: list[LeaderboardRecord], ranks: list[int | None], status: Status | None
) -> list[str]:
    lines = []
    for rank, rec in zip(ranks, rows, strict=True):
        model = _md_text(_model(rec)) + (f" `{_weights(rec)}`" if _weights(rec) else "")
        cells = [
            str(rank) if rank is not None else _MISSING,
            _md_text(rec.name),
            _md_text(rec.provenance.algorithm),
        ]
        cells += [model, _md_text(rec.provenance.workflow)]
        for ds in tab.datasets:
            value = rec.metrics.get(ds, {}).get(tab.metric)
            pm = _fmt_pm(tab.metric, _cell_std(rec, ds, tab.metric)) if value is not None else ""
            cells.append(_fmt(tab.metric, value) + (f" {pm}" if pm else ""))
        macro = rec.macro.get(tab.metric)
        pm = _fmt_pm(tab.metric, _cell_std(rec, None, tab.metric)) if macro is not None else ""
        cells += [_fmt(tab.metric, macro) + (f" {pm}" if pm else ""), str(rec.k), str(len(rec.seeds))]
        cells += [_md_text(_date(rec)), _md_text(", ".join(_status(rec, status))), f"`{rec.short_hash}`"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _pt(value: object, signed: bool = True) -> str:
    if not isinstance(value, int | float):
        return _MISSING
    return f"{100 * value:+.1f}" if signed else f"{100 * value:.1f}"


def _decision_cells(row: Mapping[str, object]) -> list[str]:
    """variant, reference, Δ, CI, P(A>B), verdict, MDE, seeds of one decision row, as text. P(A>B) and
    MDE are — with fewer than two seeds: one seed pair gives P(A>B) 0, 0.5 or 1 and no seed variance."""
    n = row.get("n_seeds")
    one = isinstance(n, int | float) and n < 2
    p = None if one else row.get("p_improvement")
    return [
        str(row.get("variant", "")),
        str(row.get("reference", "")),
        _pt(row.get("delta")),
        f"[{_pt(row.get('low'))}, {_pt(row.get('high'))}]",
        f"{p:.2f}" if isinstance(p, int | float) else _MISSING,
        str(row.get("verdict", "")),
        _MISSING if one else _pt(row.get("mde"), signed=False),
        str(row.get("n_seeds", "")),
    ]


_DECISION_HEAD = ["Variant", "vs", "Δ (pt)", "95% CI (pt)", "P(A>B)", "Verdict", "MDE (pt)", "Seeds"]


def _decision_note(rows: Sequence[Mapping[str, object]]) -> str:
    margin = rows[0].get("margin")
    margin_pt = f"±{100 * margin:g} pt" if isinstance(margin, int | float) else "the margin"
    return (
        "Paired by training seed and problem: Δ = variant - reference (macro, points), 95% two-level "
        f"bootstrap CI, P(A>B) over seed pairs; equivalent = CI inside {margin_pt}; MDE = smallest Δ "
        "detected with 80% power."
    )


def render_markdown(
    records: Iterable[LeaderboardRecord],
    metric: str | None = None,
    status: Status | None = None,
    decisions: Decisions | None = None,
) -> str:
    """Markdown with one section and table per suite (columns: rank, name, algorithm, model,
    workflow, datasets..., macro, k, seeds, date, status, record hash); partial records follow in a
    table of their own."""
    tables = suite_tables(records, metric, decisions)
    lines = ["# Leaderboard", ""]
    if not tables:
        return "\n".join(lines + ["No records.", ""])
    for tab in tables:
        lines += [f"## {_md_text(tab.suite)}", ""]
        lines += [
            f"Ranked by macro `{tab.metric}` over datasets (± std over seeds); rows share a rank unless a "
            "paired decision, or with two seeds or more non-overlapping intervals, separates them.",
            "",
        ]
        note = one_seed_note([*tab.rows, *(r for _, rs, _ in tab.protocols for r in rs)])
        if note:
            lines += [note, ""]
        head = ["#", "Name", "Algorithm", "Model", "Workflow", *[_md_text(d) for d in tab.datasets]]
        head += [f"Macro {_md_text(tab.metric)}", "k", "Seeds", "Date", "Status", "Record"]
        rule = (
            "|" + "|".join(["---:"] + [":---"] * 4 + ["---:"] * (len(tab.datasets) + 3) + [":---"] * 3) + "|"
        )
        groups: list[tuple[list[LeaderboardRecord], list[int | None], str | None]] = []
        if tab.rows or not tab.protocols:
            groups.append((tab.rows, tab.ranks, None))
        groups += [(rows, ranks, _protocol_title(name, rows)) for name, rows, ranks in tab.protocols]
        if tab.partial:
            groups.append(
                (tab.partial, tab.partial_ranks, "Partial runs (not the whole suite; ranked apart)")
            )
        for rows, ranks, title in groups:
            if title:
                lines += [f"### {title}", ""]
            if not rows:
                lines += ["No full-suite records.", ""]
                continue
            lines += ["| " + " | ".join(head) + " |", rule, *_md_rows(tab, rows, ranks, status), ""]
        dec = (decisions or {}).get(tab.suite) or []
        if dec:
            lines += ["### Decisions", "", _decision_note(dec), ""]
            lines += [
                "| " + " | ".join(_DECISION_HEAD) + " |",
                "|" + "|".join([":---"] * 2 + ["---:"] * 3 + [":---"] + ["---:"] * 2) + "|",
            ]
            lines += ["| " + " | ".join(_md_text(c) for c in _decision_cells(r)) + " |" for r in dec] + [""]
    return "\n".join(lines)


_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:2rem auto;max-width:80rem;padding:0 1rem;color:#1f2328}
h1{font-size:1.6rem}h2{font-size:1.25rem;margin-top:2rem}h3{font-size:1rem;margin-top:1.25rem}
.note,.meta{color:#59636e;font-size:.9rem}
table.lb{border-collapse:collapse;width:100%;font-size:.85rem}
table.lb th,table.lb td{border-bottom:1px solid #d1d9e0;padding:.3rem .4rem;text-align:left;vertical-align:top}
table.lb td{overflow-wrap:anywhere}
table.lb td.name{min-width:7rem;max-width:16rem}
table.lb td.model{max-width:12rem}
table.lb td.num,table.lb th[data-type=num]{text-align:right;font-variant-numeric:tabular-nums}
table.lb td.num{white-space:nowrap}
table.lb th{overflow-wrap:anywhere;hyphens:auto}
table.lb td.num .pm{display:block;color:#59636e;font-size:.75rem}
table.lb td.status{font-size:.75rem}
table.dec{border-collapse:collapse;font-size:.85rem}
table.dec th,table.dec td{border-bottom:1px solid #d1d9e0;padding:.3rem .6rem;text-align:left}
table.dec td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
table.dec td.better{color:#1a7f37;font-weight:600}table.dec td.worse{color:#cf222e;font-weight:600}
table.lb .weights,table.lb td.record code{color:#59636e;font-size:.75rem}
table.lb th{cursor:pointer;user-select:none;background:#f6f8fa;position:sticky;top:0}
table.lb th:focus{outline:2px solid #0969da}
table.lb th[aria-sort=ascending]::after{content:" \\25B2"}
table.lb th[aria-sort=descending]::after{content:" \\25BC"}
table.lb tbody tr:hover{background:#f6f8fa}
.tag{display:inline-block;border-radius:.6rem;padding:0 .35rem;margin:0 .1rem .1rem 0;background:#eef1f4}
.tag.verified,.tag.reproduced{background:#dafbe1}
.tag.checked{background:#fff8c5}
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
      if (tables[i].getAttribute("data-suite") === suite && tables[i].getAttribute("data-group") !== "partial") {
        return tables[i];
      }
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


def _td_num(metric: str, value: float | None, std: float | None = None) -> str:
    """A number cell: the value, and ``± std`` below it when known; ``data-lo``/``data-hi`` give the
    interval the rank uses."""
    if value is None:
        return f'<td class="num" data-value="">{_e(_MISSING)}</td>'
    attrs = f'data-value="{float(value)!r}"'
    pm = ""
    if std is not None:
        attrs += f' data-lo="{float(value - std)!r}" data-hi="{float(value + std)!r}"'
        pm = f'<span class="pm">{_e(_fmt_pm(metric, std))}</span>'
    return f'<td class="num" {attrs}>{_e(_fmt(metric, value))}{pm}</td>'


def _td_text(text: str, title: str | None = None, cls: str | None = None) -> str:
    tip = f' title="{_e(title)}"' if title else ""
    klass = f' class="{cls}"' if cls else ""
    return f"<td{klass}{tip}>{_e(text)}</td>"


def _html_table(
    tab: SuiteTable, rows: list[LeaderboardRecord], ranks: list[int | None], group: str, status: Status | None
) -> str:
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
        _th("status", "Status", False),
        _th("record", "Record", False),
    ]
    body = []
    for rank, rec in zip(ranks, rows, strict=True):
        prov = rec.provenance
        extra = [f"commit {prov.git_commit}", f"version {prov.package_version}", f"config {prov.config_hash}"]
        if prov.retriever:
            extra.append(f"retriever {prov.retriever}")
        if prov.corpus:
            extra.append(f"corpus {prov.corpus}")
        if rec.evidence is not None:
            extra.append(f"samples {rec.evidence.samples_sha256} ({_coverage(rec)})")
        shared = sum(1 for r in ranks if r == rank) > 1
        rank_text = _MISSING if rank is None else str(rank)
        tip = ' title="no decided difference: shared rank"' if shared else ""
        weights = prov.weights_sha256
        model = f"{_e(_model(rec))}" + (f' <code class="weights">{_e(weights[:8])}</code>' if weights else "")
        tags = _status(rec, status)
        cells = [
            f'<td class="num rank" data-value="{rank if rank is not None else ""}"{tip}>{rank_text}</td>',
            _td_text(rec.name, cls="name"),
            _td_text(prov.algorithm),
            f'<td class="model" data-value="{_e(_model(rec))}" title="{_e(weights or "")}">{model}</td>',
            _td_text(prov.workflow),
            *[
                _td_num(tab.metric, rec.metrics.get(ds, {}).get(tab.metric), _cell_std(rec, ds, tab.metric))
                for ds in tab.datasets
            ],
            _td_num(tab.metric, rec.macro.get(tab.metric), _cell_std(rec, None, tab.metric)),
            f'<td class="num" data-value="{rec.k}">{rec.k}</td>',
            f'<td class="num" data-value="{len(rec.seeds)}" title="{_e(rec.seeds)}">{len(rec.seeds)}</td>',
            f'<td data-value="{_e(prov.date)}" title="{_e(prov.date)}">{_e(_date(rec))}</td>',
            f'<td class="status" data-value="{_e(" ".join(tags))}">'
            + "".join(f'<span class="tag {_e(_tag_class(t))}">{_e(t)}</span>' for t in tags)
            + "</td>",
            f'<td class="record" data-value="{_e(rec.record_hash)}" title="{_e(chr(10).join([rec.record_hash, *extra]))}">'
            f"<code>{_e(rec.record_hash[:8])}</code></td>",
        ]
        body.append(f'<tr data-record="{_e(rec.record_hash)}">' + "".join(cells) + "</tr>")
    return (
        f'<table class="lb" data-suite="{_e(tab.suite)}" data-group="{group}" data-metric="{_e(tab.metric)}" '
        f'data-sort="macro:desc"><thead><tr>{"".join(heads)}</tr></thead>\n<tbody>\n'
        + "\n".join(body)
        + "\n</tbody></table>"
    )


def _decisions_html(suite: str, rows: Sequence[Mapping[str, object]]) -> str:
    """The suite's decision table (``data-decisions``), not sortable: its order is the comparison's."""
    heads = "".join(f"<th>{_e(h)}</th>" for h in _DECISION_HEAD)
    body = []
    for row in rows:
        cells = _decision_cells(row)
        tds = [f"<td>{_e(cells[0])}</td>", f"<td>{_e(cells[1])}</td>"]
        tds += [f'<td class="num">{_e(c)}</td>' for c in cells[2:5]]
        tds.append(f'<td class="{_e(cells[5])}">{_e(cells[5])}</td>')
        tds += [f'<td class="num">{_e(c)}</td>' for c in cells[6:]]
        body.append(f'<tr data-variant="{_e(cells[0])}">' + "".join(tds) + "</tr>")
    return (
        f'<h3>Decisions</h3><p class="meta">{_e(_decision_note(rows))}</p>'
        f'<table class="dec" data-decisions="{_e(suite)}"><thead><tr>{heads}</tr></thead>\n<tbody>\n'
        + "\n".join(body)
        + "\n</tbody></table>"
    )


def render_html(
    records: Iterable[LeaderboardRecord],
    metric: str | None = None,
    title: str = "srpo leaderboard",
    status: Status | None = None,
    decisions: Decisions | None = None,
) -> str:
    """A complete, self-contained HTML page (inline CSS/JS, no external resources).

    Dataset columns are keyed ``ds:<dataset>`` in ``data-col`` (so a dataset called ``macro`` cannot
    clash with the macro column); the URL fragment also accepts the bare dataset name when it does
    not clash. Other keys: rank, name, algorithm, model, workflow, macro, k, seeds, date, status,
    record. Each table has ``data-group="full"`` or ``"partial"``; the fragment sorts the full one.
    ``status`` maps record hashes to the tags of the Status column (default: ``unverified``);
    ``decisions`` adds each suite's decision table (:data:`Decisions`) under its records.
    """
    tables = suite_tables(records, metric, decisions)
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
        "<code>#sort=&lt;suite&gt;:&lt;column&gt;:asc|desc</code>. Cells show ± the standard deviation "
        "over seeds; rows share a rank unless a paired decision (or, with two seeds or more, "
        "non-overlapping intervals) separates them.</p>",
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
            *(
                [f'<p class="meta one-seed">{_e(note)}</p>']
                if (note := one_seed_note([*tab.rows, *(r for _, rs, _ in tab.protocols for r in rs)]))
                else []
            ),
            _html_table(tab, tab.rows, tab.ranks, "full", status)
            if tab.rows
            else "<p>No full-suite records.</p>",
        ]
        for name, rows, ranks in tab.protocols:
            parts += [
                f"<h3>{_e(_protocol_title(name, rows))}</h3>",
                _html_table(tab, rows, ranks, f"protocol-{name}", status),
            ]
        if tab.partial:
            parts += [
                "<h3>Partial runs</h3>",
                f'<p class="meta">{len(tab.partial)} record(s) that do not cover the whole suite '
                "(a limit or a dataset subset): ranked apart.</p>",
                _html_table(tab, tab.partial, tab.partial_ranks, "partial", status),
            ]
        if (decisions or {}).get(tab.suite):
            parts.append(_decisions_html(tab.suite, (decisions or {})[tab.suite]))
        parts.append("</section>")
    parts += [f"<script>\n{_JS}\n</script>", "</body>", "</html>", ""]
    return "\n".join(parts)


def write_leaderboard(
    records: Iterable[LeaderboardRecord],
    out_dir: str | os.PathLike[str],
    metric: str | None = None,
    title: str = "srpo leaderboard",
    status: Status | None = None,
    decisions: Decisions | None = None,
) -> dict[str, Path]:
    """Atomically write ``leaderboard.md`` and ``leaderboard.html`` (mode 0644) into ``out_dir``."""
    records = list(records)
    out = Path(out_dir)
    return {
        "md": atomic_write_text(out / "leaderboard.md", render_markdown(records, metric, status, decisions)),
        "html": atomic_write_text(
            out / "leaderboard.html", render_html(records, metric, title, status, decisions)
        ),
    }
