"""The fixed-K table of the team suite (benchmarks.search_team) and the suite's wiring."""

from __future__ import annotations

import pandas as pd
import pytest

from benchmarks import search_team
from benchmarks.suites import SUITES
from learners.sft import SFTConfig


def test_the_reading_teams_table_shows_where_more_searchers_help_and_where_they_do_not() -> None:
    tasks = SUITES["quick-search-team"].datasets[0].load_tasks()
    hops = {t.id: int(t.meta["hops"]) for t in tasks}
    needs = search_team.question_needs(tasks)
    assert set(needs.values()) >= {1, 2, 3}
    rows = [{"team": "oracle", "K": k, **r} for k in (1, 2, 3) for r in search_team.oracle_rows("quick-search-team", k)]
    table = search_team.fixed_k_table(pd.DataFrame(rows), hops, needs).set_index(["K", "stratum"])
    acc = table["accuracy"]
    # a question that needs one searcher: a larger team reaches nothing more
    assert acc[(1, "needs 1")] == acc[(2, "needs 1")] == acc[(3, "needs 1")] == 100.0
    # questions that need two or three: out of reach one searcher short, answered at their K
    assert acc[(1, "needs 2")] < 10.0 and acc[(2, "needs 2")] == 100.0
    assert acc[(2, "needs 3")] < 10.0 and acc[(3, "needs 3")] == 100.0
    assert acc[(1, "all")] < acc[(2, "all")] < acc[(3, "all")]
    assert table.loc[(1, "all"), "low"] <= acc[(1, "all")] <= table.loc[(1, "all"), "high"]
    text = search_team.markdown(table.reset_index())
    assert f"needs 2 ({sum(v == 2 for v in needs.values())})" in text.splitlines()[0]


def test_sft_refuses_unknown_sources() -> None:
    with pytest.raises(ValueError, match="searcher_sources"):
        SFTConfig(domain="search", searcher_sources="everywhere")
    with pytest.raises(ValueError, match="search_top_k"):
        SFTConfig(domain="search", search_top_k=0)
