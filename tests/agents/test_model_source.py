"""``--model``: a directory or a hub id; offline, an uncached hub id says it is not cached and how to fetch it."""

from __future__ import annotations

import pytest

from agents.model_source import ModelNotAvailable, resolve_model


def test_directory_and_bad_paths(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model(tmp_path) == tmp_path
    with pytest.raises(ModelNotAvailable, match="no such directory"):
        resolve_model(str(tmp_path / "missing"))
    with pytest.raises(ModelNotAvailable, match="is a file"):
        resolve_model(tmp_path / "config.json")


def test_uncached_hub_id_offline_says_how_to_fetch(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotAvailable, match="not in the local Hugging Face cache") as err:
        resolve_model("some-org/not-cached-model-xyz")
    assert "hf download some-org/not-cached-model-xyz" in str(err.value)


def test_bench_module_reexports() -> None:
    from benchmarks import model_source

    assert model_source.resolve_model is resolve_model
