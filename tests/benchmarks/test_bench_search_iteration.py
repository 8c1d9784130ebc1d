"""benchmarks/perf/bench_search_iteration.py measures the suite it is given, with that suite's settings."""

from __future__ import annotations

import pytest

from benchmarks import presets
from benchmarks.perf import bench_search_iteration as bench


def test_the_team_suite_is_measured_with_its_main_job_settings_and_worlds(tmp_path) -> None:
    cfg = bench._config(str(tmp_path), iterations=3, tasks=None, seed=0, suite="quick-search-team")
    settings = presets.QUICK_SETTINGS["quick-search-team"]
    env = presets.TRAINING_ENVS["quick-search-team"]
    assert cfg.env_id == env.env_id and cfg.model == str(env.bundled_model)
    assert cfg.env_kwargs["kb_seed"] == settings["env_kwargs"]["kb_seed"] == list(range(3, 19))
    assert cfg.env_kwargs["searcher_sources"] == env.env_kwargs["searcher_sources"]
    assert (cfg.epochs, cfg.filter_groups, cfg.iterations) == (settings["train"]["epochs"], True, 3)
    plain = bench._config(str(tmp_path), iterations=3, tasks=8, seed=0)  # quick-search, as before
    assert plain.env_kwargs["kb_seed"] == presets.TRAINING_ENVS["quick-search"].env_kwargs["kb_seed"]
    assert plain.tasks_per_iter == 8 and not plain.filter_groups


def test_set_overrides_the_suites_training_settings(tmp_path) -> None:
    sets = bench.train_layout().parse_sets(["update.pack_len=256", "update.epochs = 1"])
    assert sets == {"pack_len": 256, "epochs": 1}
    cfg = bench._config(str(tmp_path), 3, None, 0, "quick-search-team", sets)
    assert (cfg.pack_len, cfg.epochs, cfg.filter_groups) == (256, 1, True)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--suite", "quick-columns"], "argument --suite: invalid choice: 'quick-columns'"),
        (["--set", "pack_len=256"], "key 'pack_len' must be section.field; did you mean 'update.pack_len'?"),
        (["--set", "update.pack_length=256"], "unknown key 'update.pack_length'; did you mean 'update.pack_len'?"),
        (["--set", "update.pack_len"], "expected section.field=value"),
        (["--generation-rows", "64,x"], "invalid literal for int()"),
        (["--generation-rows", "64,0"], "every value must be a positive row count"),
    ],
)
def test_bad_options_are_refused_in_one_line_before_any_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], says: str
) -> None:
    monkeypatch.setattr("sys.argv", ["bench_search_iteration", *argv])
    monkeypatch.setattr(bench, "phases_and_flops", lambda *a: pytest.fail("ran"))
    with pytest.raises(SystemExit) as err:
        bench.main()
    assert err.value.code == 2
    assert says in capsys.readouterr().err
