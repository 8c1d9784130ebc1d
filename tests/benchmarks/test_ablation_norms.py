"""`srpo bench ablation --norms`: a subset of the set normalisations, refused in one line when wrong."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import benchmarks.cli as cli
import benchmarks.compare as compare
import benchmarks.compare_cli as compare_cli
from benchmarks import presets

MODEL = "agents/checkpoints/mini-columns-sft"


def _flat(output: str) -> str:
    return " ".join(output.replace("│", " ").split())


def test_norms_picks_the_variants_to_train(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    seen: list[dict] = []
    monkeypatch.setattr(compare_cli, "run_compare", lambda *a, **kw: seen.append(a[2]))
    base = ["ablation", "--model", MODEL, "--suite", "quick-columns", "--out", str(tmp_path)]
    for norms in (None, "sum,srpo-mean,k1"):
        res = CliRunner().invoke(cli.app, base + ([] if norms is None else ["--norms", norms]))
        assert res.exit_code == 0, res.output
    assert list(seen[0]) == ["srpo-sqrt", "srpo-sum", "srpo-mean", "srpo-k1"]  # the default: all four
    assert seen[1] == {k: presets.ABLATIONS[k] for k in ("srpo-sum", "srpo-mean", "srpo-k1")}


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--norms", "sum,cube"], "normalisations ['sum', 'cube'] must be distinct and among"),
        (["--norms", "sum,srpo-sum"], "must be distinct"),
        (["--norms", "sum,mean", "--reference", "sqrt"], "reference 'sqrt' is not a compared variant"),
    ],
)
def test_a_wrong_norms_or_reference_is_refused_before_any_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path, extra: list[str], says: str
) -> None:
    monkeypatch.setattr(compare, "run_comparison", lambda *a, **kw: pytest.fail("ran"))
    args = ["ablation", "--model", MODEL, "--suite", "quick-columns", "--out", str(tmp_path), *extra]
    res = CliRunner().invoke(cli.app, args)
    assert res.exit_code == 2, res.output
    assert says in _flat(res.output)
