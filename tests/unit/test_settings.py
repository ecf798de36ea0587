"""Settings: defaults that work, FTBUS_* variables over a YAML file, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.settings import Settings, load_settings


def test_defaults_work_on_one_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FTBUS_HOME", str(tmp_path))
    monkeypatch.delenv("FTBUS_CONFIG", raising=False)
    s = Settings()
    assert s.home == tmp_path and s.assets == tmp_path / "assets"
    assert s.data_timeout_s == 3600 and s.train_timeout_s == 360000
    assert s.resolve_nats_url() is None
    (tmp_path / "nats.url").write_text("nats://127.0.0.1:4999\n")
    assert s.resolve_nats_url() == "nats://127.0.0.1:4999"  # recorded by `ftbus up`


def test_environment_overrides_the_yaml_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "ftbus.yaml"
    config.write_text("max_deliver: 7\ntrain_timeout_s: 100\nretry_backoff_s: [1, 2]\n")
    monkeypatch.setenv("FTBUS_TRAIN_TIMEOUT_S", "50")
    s = load_settings(str(config))
    assert s.max_deliver == 7 and s.train_timeout_s == 50 and s.retry_backoff_s == [1.0, 2.0]


def test_openai_variables_of_the_reference_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.setenv("OPENAI_API_BASE", "http://llm.local/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "k")
    s = Settings()
    assert s.openai_base_url == "http://llm.local/v1" and s.openai_api_key == "k"


def test_bad_values_and_unknown_keys_are_rejected(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        Settings(max_deliver=0)
    config = tmp_path / "typo.yaml"
    config.write_text("max_delivr: 3\n")
    with pytest.raises(ValidationError, match="max_delivr"):
        load_settings(str(config))
    monkeypatch.setenv("FTBUS_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(FileNotFoundError, match=r"missing\.yaml"):
        Settings()
