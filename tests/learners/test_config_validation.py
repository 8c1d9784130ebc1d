"""Every bad config value is refused before any work, in one line; every accepted one is saved as used.

The property: for every ``TrainConfig`` field, hostile values generated from its declared type (the wrong
type, a bool for a number, a float for an int, NaN, inf, a huge number, an empty or multi-line or 50 KB
string, None where None is not allowed) either raise one short ``ValueError`` line, or build a config
whose experiment file (``OUT/config.toml``) reads back to the same config: nothing is silently rounded,
coerced from a bool, or saved differently from what the run uses.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from pathlib import Path
from typing import Any, Literal

import pytest

from learners import config as train_config
from learners.trainer import TrainConfig
from srpo_cli.app import main
from srpo_common.fieldcheck import QUOTE_LIMIT, conform

HINTS = typing.get_type_hints(TrainConfig)
FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]
LONG = "x" * 50_000


def _base(tp: Any) -> tuple[Any, bool]:
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType) and type(None) in args:
        return next(a for a in args if a is not type(None)), True
    return tp, False


def hostile(tp: Any) -> list[Any]:
    """Values a user, a file or a script might put in a field of type ``tp``, most of them wrong."""
    base, _ = _base(tp)
    common: list[Any] = [None, "", "1", "a\nb", LONG, [1], {"a": 1}]
    if base is bool:
        return [*common, 0, 1, 1.0, "true"]
    if base is int:
        return [*common, True, False, 1.5, 2.0, -1, 0, 2**70, -(2**70), math.nan, math.inf]
    if base is float:
        return [*common, True, math.nan, math.inf, -math.inf, -1.0, 0, 1e308, 10**400, 3]
    if base is str:
        return [*common, 1, True, 1.5, "a\x00b", "ok-name"]
    if typing.get_origin(base) is Literal:
        return [*common, 1, True, "nope"]
    if typing.get_origin(base) in (tuple, list):
        return [*common, "jsonl", ("jsonl", 1), ["jsonl", "a\nb"], ("jsonl",)]
    if typing.get_origin(base) is dict or base is dict:
        return [*common, [("a", 1)], {1: 2}, {"a": [1, 2]}]
    return common


CASES = [(name, value) for name in FIELDS for value in hostile(HINTS[name])]


def _declared(tp: Any, value: Any) -> bool:
    """``value`` is what ``tp`` declares: exactly (an int field holds an int, not a bool or a float)."""
    base, optional = _base(tp)
    if value is None:
        return optional
    origin = typing.get_origin(base)
    if base in (bool, int, float, str):
        return type(value) is base
    if origin is Literal:
        return value in typing.get_args(base)
    if origin in (tuple, list):
        item = typing.get_args(base)[0]
        return type(value) is origin and all(_declared(item, v) for v in value)
    if origin is dict or base is dict:
        return isinstance(value, dict) and all(isinstance(k, str) for k in value)
    return True


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b and type(a) is type(b)


@pytest.mark.parametrize(("name", "value"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_every_field_refuses_in_one_line_or_saves_what_it_uses(name: str, value: Any, tmp_path: Path) -> None:
    try:
        cfg = TrainConfig(**{name: value})
    except ValueError as exc:
        text = str(exc)
        assert "\n" not in text, text
        assert len(text) <= 3 * QUOTE_LIMIT + 300, f"{len(text)} characters"
        return
    used = getattr(cfg, name)
    assert _declared(HINTS[name], used), f"{name}: {value!r} accepted as {used!r}, not a {HINTS[name]}"
    assert not isinstance(used, float) or math.isfinite(used) or name.startswith("guard_max"), used
    # saved exactly as used: the run's config.toml reads back to the same config
    path = train_config.write_run_config(cfg, tmp_path)
    if path is None:  # a None nested in env kwargs cannot be TOML: the run warns and writes no file
        return
    again = train_config.read_train_config(path)
    assert _same(getattr(again, name), used), f"{name}: saved {getattr(again, name)!r}, used {used!r}"
    assert dataclasses.asdict(again) == dataclasses.asdict(cfg)


def test_an_int_field_takes_no_bool_and_no_float() -> None:
    for value in (True, 1.5, 2.0, "2"):
        with pytest.raises(ValueError, match="iterations: expected an integer"):
            TrainConfig(iterations=value)
    assert TrainConfig(lr=1).lr == 1.0 and isinstance(TrainConfig(lr=1).lr, float)
    assert conform("x", float | None, None) is None


@pytest.mark.parametrize(
    ("item", "expect"),
    [
        ('run.iterations="1"', "run.iterations: expected an integer, got a string '1'"),
        ("run.iterations=1.5", "run.iterations: expected an integer, got a float 1.5"),
        ("run.iterations=true", "run.iterations: expected an integer, got a bool True"),
        ("rollout.group_size=true", "rollout.group_size: expected an integer, got a bool True"),
        ("rollout.temperature=nan", "rollout.temperature: expected a finite number, got nan"),
        ("update.lr=inf", "update.lr: expected a finite number, got inf"),
        ("update.lr=1e400", "update.lr: expected a finite number, got inf"),
        ("update.lr=-1", "lr must be >= 0, got -1.0"),
        ("run.iterations=", "run.iterations: expected an integer, got a string ''"),
        ("run.env_kwargs={foo=1}", "takes no env kwarg 'foo'; it accepts: workflow, dataset"),
        ('run.out_dir="runs/x"\\n[evil]', "is not a valid TOML value"),
        ('run.out_dir="runs/x"\n[evil]', "a value must be one line"),
    ],
)
def test_bad_set_values_are_one_line_and_exit_2_before_any_work(
    item: str, expect: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exc:
        main(["train", "--model", "m", "--out", str(tmp_path / "run"), "--set", item])
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: srpo train: ") and expect in lines[0], err
    assert list(tmp_path.iterdir()) == []  # nothing written: not the run dir, not a directory named '"'


def test_a_huge_value_is_quoted_short(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = tmp_path / "exp.toml"
    exp.write_text('[run]\nalgo = "' + "y" * 900_000 + '"\n')
    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", str(exp), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.splitlines()) == 1 and len(err) < 1000, err[:300]
    assert "900,000 characters" in err
    exp.write_text("x" * 2_000_000)  # not an experiment file: refused by its size before it is parsed
    with pytest.raises(SystemExit) as exc:
        main(["train", "--config", str(exp)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "is not an experiment file" in err and len(err) < 600


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["train", "--bogus"], ["train", "--iterations", "x"], ["bench", "eval", "--nope"]):
        with pytest.raises(SystemExit) as exc:
            main(args)
        err = capsys.readouterr().err
        assert exc.value.code == 2
        assert len(err.strip().splitlines()) == 1 and err.startswith("error: srpo "), err
        assert "╭" not in err


def test_unknown_env_kwargs_name_the_accepted_ones() -> None:
    import srpo_envs

    with pytest.raises(srpo_envs.EnvKwargsError, match="takes no env kwarg 'bogus'; it accepts: workflow"):
        srpo_envs.make("MathVerify-v0", bogus=1)
    with pytest.raises(ValueError, match="unknown env id 'Nope-v0'"):
        TrainConfig(env_id="Nope-v0")


#: one value each section refuses, and the field its message names
_BAD_PER_SECTION = {
    "run": ("iterations", 0),
    "policy": ("lora_rank", 0),
    "rollout": ("group_size", 0),
    "update": ("weight_decay", -0.1),
    "critic": ("gae_lambda", 1.5),
    "engine": ("vllm_gpu_memory_utilization", 0.0),
    "scale": ("rollout_workers", -1),
    "eval": ("eval_problems", 0),
    "guard": ("guard_eval_drop", 0.0),
}


def test_every_section_has_its_own_check() -> None:
    assert set(_BAD_PER_SECTION) == set(train_config.TRAIN_SECTIONS)
    for name in train_config.TRAIN_SECTIONS:
        assert callable(getattr(TrainConfig, f"_check_{name}", None)), f"no _check_{name}"


@pytest.mark.parametrize("section", list(_BAD_PER_SECTION))
def test_a_bad_value_is_refused_by_its_sections_check_and_named_with_the_section(section: str) -> None:
    """Validation runs section by section: the message starts with ``[section]`` and names the field, and
    the check that raises is that section's (the other sections' checks pass on the same values)."""
    name, value = _BAD_PER_SECTION[section]
    assert name in train_config.TRAIN_SECTIONS[section]
    with pytest.raises(ValueError, match=rf"^\[{section}\] {name} must be") as info:
        TrainConfig(**{name: value})
    assert "\n" not in str(info.value)
    good = TrainConfig()
    object.__setattr__(good, name, value)  # past __setattr__'s view rebuild: only the checks run below
    for other in train_config.TRAIN_SECTIONS:
        check = getattr(good, f"_check_{other}")
        if other == section:
            with pytest.raises(ValueError):
                check()
        else:
            check()
