"""``srpo bench compare|ablation|power --max-staleness / --staleness-correction``: the variants they train."""

from __future__ import annotations

import pytest

from benchmarks.options import AlgoCompareOptions, CompareOptions, with_staleness

ALGOS = {"srpo": {"algo": "srpo"}, "grpo": {"algo": "grpo"}}


def test_no_staleness_option_leaves_the_variants_alone() -> None:
    assert with_staleness(ALGOS, AlgoCompareOptions()) is ALGOS


def test_one_level_trains_every_variant_at_it_under_its_own_name() -> None:
    got = with_staleness(ALGOS, AlgoCompareOptions(max_staleness="2"))
    assert got == {
        "srpo": {"algo": "srpo", "max_staleness": 2, "staleness_correction": "decoupled"},
        "grpo": {"algo": "grpo", "max_staleness": 2, "staleness_correction": "decoupled"},
    }


def test_levels_and_corrections_make_one_arm_each() -> None:
    """The decision of issue 50: sync vs N = 1 vs N = 2, and the plain clip beside the correction."""
    opts = AlgoCompareOptions(max_staleness="0,1,2", staleness_correction="decoupled,none")
    got = with_staleness({"srpo": {"algo": "srpo"}}, opts)
    assert list(got) == ["srpo", "srpo-async1", "srpo-async1-plain", "srpo-async2", "srpo-async2-plain"]
    assert got["srpo"]["max_staleness"] == 0
    assert got["srpo-async2-plain"] == {"algo": "srpo", "max_staleness": 2, "staleness_correction": "none"}


@pytest.mark.parametrize(
    ("n", "fix"), [("x", None), ("-1", None), ("1,1", None), ("1", "areal"), ("1", "none,none")]
)
def test_bad_values_are_refused_before_any_run(n: str, fix: str | None) -> None:
    with pytest.raises(ValueError, match="--max-staleness|--staleness-correction"):
        CompareOptions(max_staleness=n, staleness_correction=fix)
