"""The front door and the docs site (issue 49).

The README is a short front door and everything else lives on the MkDocs site under ``docs/``. These
tests keep both honest: the site builds with ``mkdocs build --strict`` (a broken link, anchor, page left
out of the nav or ``::: module`` reference fails it, and CI runs it as part of ``python3 -m pytest``),
the README stays at most 250 lines with links that resolve, its two set-up commands stay the ones
``.ci/run`` runs, and both exit-status tables list exactly the codes the CLI returns.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_README_LINES = 250

#: ``[text](target)`` outside code spans; images too (``![alt](target)``)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _mkdocs_build(config_dir: Path, site_dir: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of the project at ``config_dir`` into ``site_dir`` (never into the tree)."""
    env = {
        **os.environ,
        "NO_MKDOCS_2_WARNING": "1",
    }  # material's banner about MkDocs 2 is not a warning of ours
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
        cwd=config_dir,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _without_code(text: str) -> str:
    """Markdown with fenced blocks and inline code spans removed (links in code are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (MkDocs' default) gives a heading."""
    text = re.sub(r"`", "", heading).strip().lower()
    text = re.sub(r"[^\w\s-]", "", text)
    return re.sub(r"[-\s]+", "-", text).strip("-")


def _anchors(md: Path) -> set[str]:
    """Anchors of a markdown file's headings (outside fenced code)."""
    text = re.sub(r"^```.*?^```", "", md.read_text(), flags=re.S | re.M)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, flags=re.M)}


def _exit_table_codes(text: str, heading: str) -> list[int]:
    """The status codes in the first column of the table under ``heading`` (a markdown heading line)."""
    start = text.index(heading)
    codes: list[int] = []
    seen_table = False
    for line in text[start:].splitlines()[1:]:
        if line.startswith("#"):
            break
        m = re.match(r"^\|\s*(\d+)\s*\|", line)
        if m:
            codes.append(int(m.group(1)))
            seen_table = True
        elif seen_table and not line.startswith("|"):
            break
    return codes


def _exit_codes() -> list[int]:
    """``srpo_cli.app.EXIT_CODES``' keys, read from the source (importing the CLI would load typer and more)."""
    tree = ast.parse((ROOT / "srpo_cli" / "app.py").read_text())
    for node in ast.walk(tree):
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "EXIT_CODES" for t in targets) and isinstance(
            node.value, ast.Dict
        ):
            return [ast.literal_eval(k) for k in node.value.keys]
    raise AssertionError("srpo_cli/app.py defines no EXIT_CODES dict")


def test_the_docs_site_builds_strictly(tmp_path: Path) -> None:
    """Every page, nav entry, link, anchor and API reference resolves (``mkdocs build --strict``)."""
    result = _mkdocs_build(ROOT, tmp_path / "site")
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout}\n{result.stderr}"
    for page in ("index.html", "results/main-job/index.html", "api/learners/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    # the API pages are generated from the docstrings, not left as their ::: directives
    api = (tmp_path / "site" / "api" / "learners" / "index.html").read_text()
    assert "::: learners" not in api and "register_algorithm" in api
    # rendered, not raw: no Sphinx role left from a docstring (docs/_ext/sphinx_roles.py turns them into
    # code spans) and no escaped pipe shown literally in a table cell
    raw: dict[str, list[str]] = {}
    for page in (tmp_path / "site").rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        found = re.findall(r":(?:py:)?(?:func|meth|class|mod|data|attr|exc|obj):", text) + re.findall(r"\\\|", text)
        if found:
            raw[str(page.relative_to(tmp_path / "site"))] = sorted(set(found))
    assert not raw, f"raw Sphinx roles or literal \\| on the site: {raw}"


@pytest.mark.slow
def test_a_broken_link_or_anchor_fails_the_strict_build(tmp_path: Path) -> None:
    """The strict build is not a formality: a copy of the site with one dead link, then one dead anchor,
    fails. The copy keeps the project's config but drops the mkdocstrings plugin (its ``:::`` lines then
    stay text), so this checks MkDocs' own validation quickly; the copy without the dead link builds."""
    config = (ROOT / "mkdocs.yml").read_text()
    config, n = re.subn(r"\n  - mkdocstrings:\n(?:(?:        |      ).*\n|\s*\n)*", "\n", config)
    assert n == 1 and "mkdocstrings" not in config.split("plugins:")[1]
    for name, broken in (
        ("clean", ""),
        ("page", "[gone](no-such-page.md)"),
        ("anchor", "[gone](cli.md#no-such-heading)"),
    ):
        copy = tmp_path / name
        shutil.copytree(ROOT / "docs", copy / "docs")
        (copy / "mkdocs.yml").write_text(config)
        index = copy / "docs" / "index.md"
        index.write_text(index.read_text() + f"\n{broken}\n")
        result = _mkdocs_build(copy, copy / "site")
        out = result.stdout + result.stderr
        if not broken:
            assert result.returncode == 0, out
            continue
        assert result.returncode != 0, f"a strict build with {broken} passed:\n{out}"
        assert ("no-such-heading" if "#" in broken else "no-such-page.md") in out, out


def test_readme_is_a_front_door() -> None:
    """At most 250 lines, with the two set-up commands ``.ci/run`` runs and the main job's command."""
    lines = README.read_text().splitlines()
    assert len(lines) <= MAX_README_LINES, f"README.md has {len(lines)} lines (at most {MAX_README_LINES})"
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    commands = [b.strip() for b in blocks]
    assert "bash install.sh" in commands and "python3 -m pytest" in commands
    assert "srpo bench quick --out runs/quick" in commands
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert any(line.startswith("bash install.sh") for line in ci)
    assert any(line.strip() == "python3 -m pytest" for line in ci)


def test_every_relative_link_in_the_readme_resolves() -> None:
    """Relative links point at files in the repository, and ``page.md#anchor`` at a heading there."""
    links = _LINK.findall(_without_code(README.read_text()))
    relative = [t for t in links if not re.match(r"^[a-z][a-z0-9+.-]*:", t) and not t.startswith("#")]
    assert relative, "the README links to no docs page"
    problems = []
    for target in relative:
        path, _, anchor = target.partition("#")
        file = (README.parent / path).resolve()
        if not file.exists():
            problems.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            problems.append(f"{target}: no heading with anchor #{anchor} in {path}")
    assert not problems, "\n".join(problems)


def test_the_readme_links_every_docs_page_of_the_nav_top_level() -> None:
    """Each guide page on the site's nav is one click from the README."""
    nav_pages = re.findall(r"^      - [^:]+: ([\w/-]+\.md)$", (ROOT / "mkdocs.yml").read_text(), flags=re.M)
    guide = [p for p in nav_pages if "/" not in p]
    readme_targets = {t.partition("#")[0] for t in _LINK.findall(README.read_text())}
    missing = [p for p in guide if f"docs/{p}" not in readme_targets]
    assert guide and not missing, f"guide pages the README does not link: {missing}"


@pytest.mark.parametrize(
    ("doc", "heading"), [("README.md", "## Exit status"), ("docs/cli.md", "## Errors and exit status")]
)
def test_the_exit_status_tables_list_the_cli_codes(doc: str, heading: str) -> None:
    """A code added to ``srpo_cli.app.EXIT_CODES`` without its row (or a row without its code) fails."""
    codes = _exit_table_codes((ROOT / doc).read_text(), heading)
    assert codes == sorted(codes), f"{doc}: rows out of order: {codes}"
    assert codes == sorted(_exit_codes()), (
        f"{doc} lists {codes}; srpo_cli.app.EXIT_CODES has {sorted(_exit_codes())}"
    )


def test_docs_pages_named_in_the_code_exist() -> None:
    """Comments and docstrings send readers to ``docs/...md`` pages (the measurements behind a preset, a
    cache size, a recipe); a page that moves or is renamed must take those pointers along."""
    packages = (
        "srpo_common",
        "srpo_envs",
        "agents",
        "learners",
        "benchmarks",
        "leaderboards",
        "srpo_cli",
        "tests",
    )
    named: dict[str, list[str]] = {}
    for package in packages:
        for py in sorted((ROOT / package).rglob("*.py")):
            for page in re.findall(r"\bdocs/\w[\w./-]*\.md\b", py.read_text(encoding="utf-8")):
                named.setdefault(page, []).append(str(py.relative_to(ROOT)))
    assert named, "no module names a docs page"
    missing = {page: files for page, files in named.items() if not (ROOT / page).is_file()}
    assert not missing, f"docs pages named in the code that do not exist: {missing}"


def test_the_main_job_page_leads_with_the_readmes_numbers() -> None:
    """docs/results/main-job.md opens with one current summary, and it is the README's: the same table of
    before/after/gain rows and the same wall time and memory (the history stays below it)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    page = (ROOT / "docs" / "results" / "main-job.md").read_text(encoding="utf-8")
    first = page.split("\n## ")[1]
    assert first.startswith("Summary\n"), "the page's first section is not its summary"

    def rows(text: str) -> list[str]:
        start = text.index("| suite (held-out) | algorithm |")
        block = text[start:].split("\n\n")[0]  # the table: up to the first blank line
        return block.splitlines()

    assert rows(first) == rows(readme)
    cost = re.search(r"\*\*(\d+) s\*\* wall, largest process ([\d.]+) GB RSS, ([\d.]+) GB PSS", readme)
    assert cost is not None
    assert f"**{cost[1]} s** wall, largest\nprocess {cost[2]} GB RSS, {cost[3]} GB PSS" in first


def test_every_results_page_leads_with_the_readmes_line_for_it() -> None:
    """Each results page opens with one current summary, and it says what the README's results table says
    of it, word for word (numbers included); every results page is in that table (the main job has its
    own table, checked above), and the history stays below the summary."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("| results page | what it says today |") :].split("\n\n")[0]
    lines = {
        m[1]: m[2] for m in re.finditer(r"^\| \[[^]]+\]\(docs/results/([\w-]+\.md)\) \| (.+) \|$", table, re.M)
    }
    pages = {p.name for p in (ROOT / "docs" / "results").glob("*.md")} - {"index.md", "main-job.md"}
    assert set(lines) == pages, "results pages missing from the README's table (or linked but absent)"
    for name, line in lines.items():
        page = (ROOT / "docs" / "results" / name).read_text(encoding="utf-8")
        first = page.split("\n## ")[1]
        assert first.startswith("Summary\n"), f"{name}: the first section is not its summary"
        assert f"Today: {line}." in " ".join(first.split()), f"{name}: the summary is not the README's line"
        assert len(page.split("\n## ")) > 2, f"{name}: no history below the summary"
