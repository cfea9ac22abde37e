"""ServerSettings: defaults, PIPESERVE_* variables, the seed services' variables, and explicit arguments."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from pipeserve.config import ServerSettings

FIELDS = [
    "spec_dir",
    "host",
    "port",
    "workers",
    "backlog",
    "limit_max_requests",
    "max_requests_jitter",
    "graceful_timeout_s",
    "log_level",
    "log_format",
    "access_log",
    "max_body_bytes",
    "warmup_runs",
    "root_path",
]
SEED_NAMES = [
    "HOST",
    "PORT",
    "WORKERS",
    "BACKLOG",
    "LIMIT_MAX_REQUESTS",
    "MAX_REQUESTS_JITTER",
    "GRACEFUL_TIMEOUT",
    "LOGLEVEL",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the machine running the tests has set must not leak into them."""
    for name in FIELDS:
        monkeypatch.delenv(name.upper(), raising=False)
        monkeypatch.delenv(f"PIPESERVE_{name.upper()}", raising=False)
    for name in SEED_NAMES:
        monkeypatch.delenv(name, raising=False)


def test_defaults():
    settings = ServerSettings()

    assert settings.host == "127.0.0.1"
    assert settings.port == 8000
    assert settings.workers == 1
    assert settings.backlog == 2048
    assert settings.limit_max_requests is None
    assert settings.max_requests_jitter == 0
    assert settings.graceful_timeout_s == 10.0
    assert settings.log_level == "info"
    assert settings.log_format == "json"
    assert settings.access_log is True


def test_seed_environment_variables(monkeypatch):
    for name, value in {
        "HOST": "0.0.0.0",
        "PORT": "9001",
        "WORKERS": "4",
        "BACKLOG": "64",
        "LIMIT_MAX_REQUESTS": "1000",
        "MAX_REQUESTS_JITTER": "50",
        "GRACEFUL_TIMEOUT": "3.5",
        "LOGLEVEL": "DEBUG",
    }.items():
        monkeypatch.setenv(name, value)

    settings = ServerSettings()

    assert settings.host == "0.0.0.0"
    assert settings.port == 9001
    assert settings.workers == 4
    assert settings.backlog == 64
    assert settings.limit_max_requests == 1000
    assert settings.max_requests_jitter == 50
    assert settings.graceful_timeout_s == 3.5
    assert settings.log_level == "debug"


def test_pipeserve_environment_variables(monkeypatch, tmp_path):
    for name, value in {
        "PIPESERVE_SPEC_DIR": str(tmp_path),
        "PIPESERVE_HOST": "::1",
        "PIPESERVE_PORT": "9002",
        "PIPESERVE_WORKERS": "2",
        "PIPESERVE_BACKLOG": "16",
        "PIPESERVE_LIMIT_MAX_REQUESTS": "10",
        "PIPESERVE_MAX_REQUESTS_JITTER": "1",
        "PIPESERVE_GRACEFUL_TIMEOUT_S": "0",
        "PIPESERVE_LOG_LEVEL": "Warning",
        "PIPESERVE_LOG_FORMAT": "text",
        "PIPESERVE_ACCESS_LOG": "false",
        "PIPESERVE_MAX_BODY_BYTES": "2048",
        "PIPESERVE_WARMUP_RUNS": "0",
        "PIPESERVE_ROOT_PATH": "/api",
    }.items():
        monkeypatch.setenv(name, value)

    settings = ServerSettings()

    assert settings.spec_dir == tmp_path.resolve()
    assert settings.host == "::1"
    assert settings.port == 9002
    assert settings.workers == 2
    assert settings.backlog == 16
    assert settings.limit_max_requests == 10
    assert settings.max_requests_jitter == 1
    assert settings.graceful_timeout_s == 0
    assert settings.log_level == "warning"
    assert settings.log_format == "text"
    assert settings.access_log is False
    assert settings.max_body_bytes == 2048
    assert settings.warmup_runs == 0
    assert settings.root_path == "/api"


def test_explicit_arguments_win_over_the_environment(monkeypatch):
    monkeypatch.setenv("PORT", "9001")
    monkeypatch.setenv("PIPESERVE_PORT", "9002")
    monkeypatch.setenv("LOGLEVEL", "debug")

    settings = ServerSettings(port=1234, log_level="error")

    assert settings.port == 1234
    assert settings.log_level == "error"


def test_pipeserve_name_wins_over_the_seed_name(monkeypatch):
    # PORT and HOST are generic names that platforms and shells set for their own purposes.
    monkeypatch.setenv("PORT", "9001")
    monkeypatch.setenv("PIPESERVE_PORT", "9002")

    assert ServerSettings().port == 9002


@pytest.mark.parametrize(
    ("name", "value", "field"),
    [
        ("SPEC_DIR", "/somewhere/else", "spec_dir"),
        ("LOG_FORMAT", "text", "log_format"),
    ],
)
def test_only_pipeserve_and_seed_names_are_read(monkeypatch, name, value, field):
    default = getattr(ServerSettings(), field)
    monkeypatch.setenv(name, value)

    assert getattr(ServerSettings(), field) == default


def test_spec_dir_is_made_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)

    assert ServerSettings(spec_dir=Path("examples/iris")).spec_dir == tmp_path.resolve() / "examples" / "iris"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("PORT", "http"),
        ("PORT", "70000"),
        ("WORKERS", "0"),
        ("LOGLEVEL", "loud"),
        ("GRACEFUL_TIMEOUT", "-1"),
        ("PIPESERVE_MAX_BODY_BYTES", "10"),
    ],
)
def test_bad_environment_values_are_refused(monkeypatch, name, value):
    monkeypatch.setenv(name, value)

    with pytest.raises(ValidationError):
        ServerSettings()


def test_settings_are_frozen():
    settings = ServerSettings()

    with pytest.raises(ValidationError):
        settings.port = 1  # type: ignore[misc]
