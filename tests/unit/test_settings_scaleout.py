"""Scale-out settings that would break a guarantee are refused at start-up, by name."""

from __future__ import annotations

import pytest

from knowledgeops.errors import SettingsError
from knowledgeops.settings import load_settings


def test_broker_and_cache_must_not_share_a_redis_database() -> None:
    with pytest.raises(SettingsError, match="same Redis database"):
        load_settings(broker_url="redis://h:6379/0", cache_url="redis://h:6379")
    settings = load_settings(broker_url="redis://h:6379/0", cache_url="redis://h:6379/2")
    assert settings.cache_url is not None
    load_settings(broker_url="redis://h:6379/0", cache_url="redis://other:6379/0")
    load_settings(broker_url="amqp://guest:guest@h:5672//", cache_url="redis://h:6379/0")


def test_the_cache_must_be_redis() -> None:
    with pytest.raises(SettingsError, match="cache_url must be a redis"):
        load_settings(cache_url="memcached://h:11211")


def test_visibility_timeout_must_outlast_the_hard_time_limit() -> None:
    with pytest.raises(SettingsError, match=r"hard limit, 130"):
        load_settings(job_time_limit_s=100, broker_visibility_timeout_s=120)
    assert load_settings(job_time_limit_s=100).visibility_timeout_s == 200
    assert load_settings(job_time_limit_s=5).visibility_timeout_s == 95  # hard limit + 60 s
    assert load_settings(job_time_limit_s=100, broker_visibility_timeout_s=131)


def test_secrets_and_urls_are_only_said_to_be_set() -> None:
    shown = load_settings(
        broker_url="redis://:pw1@h:6379/0", cache_url="redis://:pw2@h:6379/2"
    ).describe()
    assert (shown["broker_url"], shown["cache_url"], shown["database_url"]) == (
        "set",
        "set",
        "not set",
    )
    assert "pw1" not in repr(shown)
    assert "pw2" not in repr(shown)


def test_an_http_embedder_behind_a_broker_needs_the_shared_limits_redis(tmp_path: object) -> None:
    with pytest.raises(SettingsError, match="needs KOPS_CACHE_URL"):
        load_settings(embedder="openai", openai_api_key="k", broker_url="redis://h:6379/0")
    load_settings(
        embedder="openai",
        openai_api_key="k",
        broker_url="redis://h:6379/0",
        cache_url="redis://h:6379/2",
    )
    with pytest.raises(SettingsError, match="KOPS_OPENAI_API_KEY or KOPS_OPENAI_API_KEY_FILE"):
        load_settings(embedder="openai")
