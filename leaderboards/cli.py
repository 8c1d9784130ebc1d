"""``srpo leaderboard ...``: submit, validate, reproduce, sign and render result records.

Exit status is the contract for CI: ``validate`` exits 1 when anything is invalid, after printing
every problem (not just the first), so one CI run shows all that needs fixing.

``validate`` re-derives each record from its per-sample evidence (:mod:`leaderboards.evidence`);
regrading the answers and re-generating samples need the env and model code, which this package may
not import. ``srpo_cli`` therefore passes them in with :func:`configure`; run standalone, ``validate``
still checks the evidence file, the sample grid and every metric, and says that it did not regrade.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from srpo_common import atomic_write_text
from srpo_common.jsonsafe import loads_bounded

from .evidence import EvidenceError, SampleGrader, SampleSet, check_evidence, load_samples, samples_path
from .export import FORMATS, ExportError, export_record
from .render import write_leaderboard
from .reproduction import plan_reproduction
from .schema import LeaderboardRecord, RecordValidationError, dump_record_json, load_record, load_records
from .signing import SigningError, generate_key, load_keys, sign_record, verify_signature
from .store import LeaderboardStore, StoreError

app = typer.Typer(
    help="Leaderboard records: submit, validate, reproduce, sign, render.", no_args_is_help=True
)

#: A reproduction note is a few fields; anything bigger is not one.
_MAX_NOTE_BYTES = 4096

#: Set by :func:`configure` (``srpo_cli`` wires the benchmark grader and reproducer in).
_HOOKS: dict[str, Callable[..., Any] | None] = {"grader": None, "reproducer": None}


def configure(
    grader_factory: Callable[[], SampleGrader] | None = None, reproducer: Callable[..., Any] | None = None
) -> None:
    """Install the regrading hook (a factory of :class:`~leaderboards.evidence.SampleGrader`) and the
    reproducer (``reproducer(record, sample_set, model_dir, n=, rng_seed=, log=)`` returning a report
    with ``compared``, ``mismatches`` and ``ok``)."""
    _HOOKS["grader"] = grader_factory
    _HOOKS["reproducer"] = reproducer


def _fail(lines: list[str], code: int = 1) -> None:
    for line in lines:
        typer.echo(line, err=True)
    raise typer.Exit(code)


def _default_samples(record: LeaderboardRecord, base: Path) -> Path | None:
    return samples_path(base, record.evidence.samples_sha256) if record.evidence is not None else None


def _checked_samples(
    record: LeaderboardRecord, base: Path, grader: SampleGrader | None, path: Path | None = None
) -> tuple[SampleSet | None, list[str]]:
    """One record's evidence file (``path``, else ``base/samples/<sha256>.jsonl``) and its problems: the
    file's own (size, hash, format) or every check of :func:`check_evidence`; (None, [why]) without one."""
    if record.evidence is None:
        return None, ["no per-sample evidence: its numbers cannot be checked"]
    try:
        sample_set = load_samples(path or samples_path(base, record.evidence.samples_sha256), record.evidence)
    except EvidenceError as exc:
        return None, [str(exc)]
    return sample_set, check_evidence(record, sample_set, grader)


def _evidence_errors(
    record: LeaderboardRecord, base: Path, grader: SampleGrader | None, allow_missing: bool
) -> list[str]:
    """Problems of one record's evidence (the sample file sits in ``base/samples/``)."""
    if record.evidence is None and allow_missing:
        return []
    return _checked_samples(record, base, grader)[1]


def _describe(record: LeaderboardRecord) -> str:
    ev = record.evidence
    if ev is None:
        return "no evidence"
    if ev.partial:
        return (
            f"PARTIAL: {sum(ev.problems.values())} of {sum(ev.suite_problems.values())} problems of the suite"
        )
    protocol = (
        "" if ev.protocol is None else f" (protocol {ev.protocol}: {sum(ev.problems.values())} problems)"
    )
    return f"{ev.n_samples} samples checked{protocol}"


@app.command()
def submit(
    file: Annotated[Path, typer.Argument(help="Record JSON file to add.")],
    store: Annotated[Path, typer.Option("--store", help="Store directory.")],
    samples: Annotated[
        Path | None, typer.Option(help="Its sample file (default: FILE's dir/samples/<sha256>.jsonl).")
    ] = None,
) -> None:
    """Validate FILE and copy it (and its sample file) into the store under its canonical name."""
    try:
        record = load_record(file)
        path = LeaderboardStore(store).submit(record, samples or _default_samples(record, file.parent))
    except RecordValidationError as exc:
        _fail([f"invalid: {exc.source or file}", *(f"  - {e}" for e in exc.errors)])
    except (StoreError, EvidenceError) as exc:
        _fail([f"error: {exc}"])
    typer.echo(str(path))


@app.command()
def validate(
    files: Annotated[list[Path] | None, typer.Argument(help="Record files (or results lists).")] = None,
    store: Annotated[
        Path | None, typer.Option("--store", help="Validate every record in this store.")
    ] = None,
    allow_missing_evidence: Annotated[
        bool, typer.Option(help="Accept records without a per-sample file (older records).")
    ] = False,
    regrade: Annotated[bool, typer.Option(help="Regrade every answer (needs the srpo grader).")] = True,
) -> None:
    """Validate records: schema, evidence, every metric recomputed, every answer regraded; exit 1 on any
    problem. Records that do not cover the whole suite are reported as PARTIAL."""
    if not files and store is None:
        _fail(["error: give record files and/or --store DIR"], code=2)
    factory = _HOOKS["grader"] if regrade else None
    grader = factory() if factory is not None else None
    if regrade and grader is None:
        typer.echo("note: answers not regraded (no grader configured; run as `srpo leaderboard validate`)")
    results: dict[str, list[str]] = {}
    notes: dict[str, str] = {}
    for file in files or []:
        try:
            records = load_records(file)
        except RecordValidationError as exc:
            results[str(file)] = exc.errors
            continue
        for i, rec in enumerate(records):
            label = str(file) if len(records) == 1 else f"{file}[{i}] {rec.name}"
            results[label] = _evidence_errors(rec, file.parent, grader, allow_missing_evidence)
            notes[label] = _describe(rec)
    if store is not None:
        if not store.is_dir():
            _fail([f"error: store {store} is not a directory"], code=2)
        st = LeaderboardStore(store)
        for name, errors in st.validate_all().items():
            label = str(store / name)
            results[label] = list(errors)
            if not errors:
                rec = st.load(name)
                results[label] += _evidence_errors(rec, store, grader, allow_missing_evidence)
                notes[label] = _describe(rec)
    bad = {name: errs for name, errs in results.items() if errs}
    for name in results:
        if not results[name]:
            typer.echo(f"ok: {name} ({notes.get(name, '')})")
    if bad:
        lines = []
        for name, errs in bad.items():
            lines += [f"invalid: {name}", *(f"  - {e}" for e in errs)]
        lines.append(f"{len(bad)} of {len(results)} record(s) invalid")
        _fail(lines)
    typer.echo(f"{len(results)} record(s) valid")


@app.command()
def export(
    file: Annotated[Path, typer.Argument(help="Record JSON file (or a results list, with --name).")],
    fmt: Annotated[str, typer.Option("--format", help=f"One of: {', '.join(FORMATS)}.")],
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("export"),
    name: Annotated[str | None, typer.Option(help="The record's name in a results list.")] = None,
    samples: Annotated[
        Path | None, typer.Option(help="Its sample file (default: FILE's dir/samples/<sha256>.jsonl).")
    ] = None,
    source_url: Annotated[
        str | None, typer.Option(help="hf: where the record is published (the entry's source.url).")
    ] = None,
    dataset_id: Annotated[
        str | None, typer.Option(help="hf: the Hub benchmark dataset of the suite (default: srpo/<suite>).")
    ] = None,
    organization: Annotated[str, typer.Option(help="eee: source_organization_name.")] = "srpo",
    relationship: Annotated[
        str, typer.Option(help="eee: evaluator_relationship (first_party, third_party, collaborative, other).")
    ] = "first_party",
    unverified: Annotated[
        bool,
        typer.Option(help="Export a record whose evidence is missing or does not check out, marked unverified."),
    ] = False,
) -> None:
    """Export a validated record as Every Eval Ever JSON (+ instance JSONL), a Hub .eval_results YAML or
    an lm-eval results JSON; a record whose evidence does not check out is refused (--unverified)."""
    if fmt not in FORMATS:
        _fail([f"error: --format must be one of {', '.join(FORMATS)}, got {fmt!r}"], code=2)
    try:
        record = _pick(load_records(file), name, file)
    except RecordValidationError as exc:
        _fail([f"error: {file} is not a valid record: {exc.errors[0]}"], code=2)
    factory = _HOOKS["grader"]
    grader = factory() if factory is not None else None
    sample_set, problems = _checked_samples(record, file.parent, grader, samples)
    if problems and not unverified:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        _fail([f"error: {record.name} is not verified: {problems[0]}{more}; pass --unverified to export it marked so"], code=2)
    question = getattr(grader, "question", None)
    try:
        written = export_record(
            record, fmt, out, sample_set, verified=not problems, record_url=source_url, dataset_id=dataset_id,
            organization=organization, relationship=relationship,
            question_of=(lambda ds, i: question(record.suite, ds, i)) if question and sample_set else None,
        )  # fmt: skip
    except ExportError as exc:
        _fail([f"error: {exc}"], code=2)
    for path in written:
        typer.echo(f"wrote {path}")
    if problems:
        typer.echo(f"note: exported UNVERIFIED ({problems[0]})")


def _pick(records: list[LeaderboardRecord], name: str | None, file: Path) -> LeaderboardRecord:
    if name is None:
        if len(records) == 1:
            return records[0]
        listing = [f"  {r.short_hash}  {r.name}  [{r.suite}]" for r in records]
        _fail([f"error: {file} holds {len(records)} records; choose one with --name", *listing], code=2)
    hits = [r for r in records if name in (r.name, r.record_hash) or r.record_hash.startswith(name)]
    if len(hits) != 1:
        # the same name in several suites (e.g. bench quick's start model): the hash tells them apart
        listing = [f"  {r.short_hash}  {r.name}  [{r.suite}]" for r in hits]
        hint = ["pass the record hash (or a prefix of it) as --name:"] if hits else []
        _fail([f"error: --name {name!r} matches {len(hits)} records of {file}", *hint, *listing], code=2)
    return hits[0]


@app.command()
def reproduce(
    record_file: Annotated[Path, typer.Argument(help="Record file or results list (e.g. results.json).")],
    model: Annotated[Path, typer.Option("--model", help="Model directory with the record's weights.")],
    name: Annotated[str | None, typer.Option(help="Record name or hash prefix (for a results list).")] = None,
    max_chunks: Annotated[
        int | None,
        typer.Option(
            "--max-chunks",
            min=1,
            help="Re-generate only this many chunks, drawn at random (default: every seed x dataset x "
            "chunk stratum, i.e. every sample); the detection probability is printed.",
        ),
    ] = None,
    n: Annotated[
        int | None, typer.Option("--n", min=1, hidden=True, help="Deprecated: same as --max-chunks.")
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(help="Seed of the random choice (default: drawn now from the OS and printed)."),
    ] = None,
    store: Annotated[
        Path | None, typer.Option(help="Store to note a successful reproduction in (shown on the page).")
    ] = None,
) -> None:
    """Re-generate a record's samples from its seeds and compare (exact on CPU): every chunk by default,
    or ``--max-chunks`` chunks chosen with a seed the record's author cannot predict (see
    :mod:`leaderboards.reproduction`)."""
    reproducer = _HOOKS["reproducer"]
    if reproducer is None:
        _fail(["error: reproduce needs the model code; run it as `srpo leaderboard reproduce`"], code=2)
    if n is not None and max_chunks is None:
        typer.echo(f"note: --n is deprecated; taking it as --max-chunks {n}", err=True)
        max_chunks = n
    try:
        record = _pick(load_records(record_file), name, record_file)
        if record.evidence is None:
            _fail([f"error: record {record.name!r} has no per-sample evidence to reproduce"], code=2)
        sample_set = load_samples(
            samples_path(record_file.parent, record.evidence.samples_sha256), record.evidence
        )
        errors = check_evidence(record, sample_set)  # a chunk plan needs a well-formed sample grid
        if errors:
            _fail([f"invalid: {record_file} ({record.name})", *(f"  - {e}" for e in errors)])
        plan = plan_reproduction(
            sample_set.samples, _chunk_size(sample_set.header), max_chunks=max_chunks, seed=seed
        )
        for line in plan.summary():
            typer.echo(line)
        report = reproducer(record, sample_set, model, chunks=plan.chunks, rng_seed=plan.seed, log=typer.echo)
    except RecordValidationError as exc:
        _fail([f"invalid: {exc.source or record_file}", *(f"  - {e}" for e in exc.errors)])
    except ValueError as exc:  # EvidenceError, ReproduceError
        _fail([f"error: {exc}"])
    for line in report.mismatches:
        typer.echo(f"mismatch: {line}", err=True)
    matched = report.compared - len(report.mismatches)
    where = f"{plan.label}; {len(plan.chunks)} of {plan.n_chunks} chunks"
    if not report.ok:
        rerun = [] if plan.every_stratum else [f"re-run this check with --seed {plan.seed}"]
        head = f"NOT reproduced: {matched} of {report.compared} samples match ({record.name}; {where})"
        _fail([head, *rerun])
    if store is not None:
        note = {
            "record_hash": record.record_hash,
            "compared": report.compared,
            "matched": matched,
            "total": plan.total_samples,
            "seed": plan.seed,
            "chunks": len(plan.chunks),
            "n_chunks": plan.n_chunks,
            "date": dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat(),
        }
        atomic_write_text(
            store / "reproduced" / f"{record.record_hash}.json", json.dumps(note, indent=2) + "\n"
        )
    typer.echo(
        f"reproduced: {matched} of {report.compared} samples match exactly "
        f"({record.name}; {plan.total_samples} samples in the record; {where})"
    )


def _chunk_size(header: dict[str, Any]) -> int:
    size = header.get("chunk_size")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise EvidenceError(f"evidence header chunk_size must be a positive integer, got {size!r}")
    return size


@app.command()
def keygen(
    out: Annotated[Path, typer.Option("--out", help="Private key file to write (PEM, mode 0600).")],
    key_id: Annotated[str, typer.Option("--key-id", help="Your submitter id in the keys file.")],
) -> None:
    """Create an ed25519 signing key; prints the line to add to the leaderboard's keys file."""
    if out.exists():
        _fail([f"error: {out} exists; not overwriting a key"], code=2)
    public = generate_key(out)
    typer.echo(json.dumps({key_id: public}))


@app.command()
def sign(
    file: Annotated[Path, typer.Argument(help="Record JSON file to sign (rewritten in place).")],
    key: Annotated[Path, typer.Option("--key", help="Private key (from `keygen`).")],
    key_id: Annotated[str, typer.Option("--key-id", help="Submitter id of the key.")],
) -> None:
    """Sign a record's hash (which covers its sample file's sha256) with an ed25519 key."""
    try:
        signed = sign_record(load_record(file), key, key_id)
    except RecordValidationError as exc:
        _fail([f"invalid: {exc.source or file}", *(f"  - {e}" for e in exc.errors)])
    except SigningError as exc:
        _fail([f"error: {exc}"])
    atomic_write_text(file, dump_record_json(signed))
    typer.echo(f"signed {file} as {key_id}")


def row_status(store: Path, records: list[LeaderboardRecord], keys_file: Path | None) -> dict[str, list[str]]:
    """Per record hash: ``verified``/``unverified`` (signature by a known key) and, from a note of
    ``reproduce --store``, ``reproduced M/N (all chunks)`` or ``reproduced M/N (seed S)``: M samples
    re-generated exactly out of the N in the record, every chunk or chunks drawn with seed S (so anyone
    can re-run that check). A note from the first version
    (a fixed, predictable seed) only says ``checked M samples (predictable seed)``."""
    keys = load_keys(keys_file) if keys_file is not None else {}
    status = {}
    for rec in records:
        tags = ["verified" if verify_signature(rec, keys) else "unverified"]
        note = _reproduction_note(store / "reproduced" / f"{rec.record_hash}.json", rec.record_hash)
        if note is not None:
            tags.append(note)
        status[rec.record_hash] = tags
    return status


def _reproduction_note(path: Path, record_hash: str) -> str | None:
    """The Status tag of a reproduction note, or ``None`` when there is none or it is malformed."""
    try:
        if not path.is_file() or path.stat().st_size > _MAX_NOTE_BYTES:
            return None
        note = loads_bounded(path.read_bytes(), 4, "reproduction note")
    except (OSError, ValueError):
        return None
    if not isinstance(note, dict) or note.get("record_hash") != record_hash:
        return None
    fields = {k: note.get(k) for k in ("matched", "compared", "total", "seed")}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in fields.values()):
        matched = note.get("matched")
        if isinstance(matched, int) and not isinstance(matched, bool) and matched >= 0:
            return f"checked {matched} samples (predictable seed)"
        return None
    every = note.get("chunks") == note.get("n_chunks") and isinstance(note.get("chunks"), int)
    how = "all chunks" if every else f"seed {fields['seed']}"
    return f"reproduced {fields['matched']}/{fields['total']} ({how})"


@app.command()
def render(
    store: Annotated[Path, typer.Option("--store", help="Store directory.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory.")],
    metric: Annotated[str | None, typer.Option(help="Rank by this metric (default: avg@k).")] = None,
    keys: Annotated[Path | None, typer.Option(help="Keys file of known submitters (JSON).")] = None,
) -> None:
    """Write OUT/leaderboard.md and OUT/leaderboard.html from every valid record in the store.

    Invalid records (tampered, malformed, hostile) are listed on stderr and left off the page, the
    rest is rendered, and the exit status is then 1, so CI still notices a store that needs fixing."""
    if not store.is_dir():
        _fail([f"error: store {store} is not a directory"], code=2)
    try:
        scan = LeaderboardStore(store)._scan()  # each file read once: the invalid ones and the rest
        bad = {name: errs for name, (_, errs) in scan.items() if errs}
        records = [rec for rec, errs in scan.values() if rec is not None and not errs]
        status = row_status(store, records, keys)
    except (StoreError, SigningError) as exc:
        _fail([f"error: {exc}"])
    for name, errs in bad.items():
        typer.echo(f"skipped invalid: {store / name}", err=True)
        for err in errs:
            typer.echo(f"  - {err}", err=True)
    paths = write_leaderboard(records, out, metric=metric, status=status)
    for path in paths.values():
        typer.echo(str(path))
    if bad:
        typer.echo(f"{len(bad)} invalid record(s) left off the page; {len(records)} rendered", err=True)
        raise typer.Exit(1)
