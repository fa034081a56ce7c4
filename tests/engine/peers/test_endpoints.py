"""Endpoint configuration: ``NAME=URL`` entries from flags and ``CBP_ENDPOINTS``, checked."""

from __future__ import annotations

import pytest

from engine.peers.endpoints import (
    Endpoint,
    endpoints_from_env,
    parse_endpoint,
    parse_endpoints,
    with_records,
)


def test_parse_endpoint_keeps_the_root_url():
    """A trailing '/' or '/v1' is dropped: the engine adds the API paths itself."""
    assert parse_endpoint("gpu=http://10.0.0.5:8000/v1/") == Endpoint("gpu", "http://10.0.0.5:8000")
    assert parse_endpoint(" a.b-c_1 = https://host/prefix ") == Endpoint(
        "a.b-c_1", "https://host/prefix"
    )


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("gpu", "NAME=URL"),
        ("=http://h:1", "NAME=URL"),
        ("gpu=", "NAME=URL"),
        ("bad name=http://h:1", "must start with a letter or digit"),
        ("gpu=ftp://h:1", "http:// or https://"),
        ("gpu=10.0.0.5:8000", "http:// or https://"),
        ("gpu=http://h:1/?x=1", "query"),
        ("gpu=http://h:99999", "port"),
    ],
)
def test_bad_endpoint_is_refused_with_its_text(text, words):
    """A malformed entry raises ValueError that quotes it and says what is wrong."""
    with pytest.raises(ValueError, match=words) as info:
        parse_endpoint(text)
    assert repr(text.strip()) in str(info.value), f"message does not quote the entry: {info.value}"


def test_names_must_be_unique_and_not_builtin():
    """A name used twice, or by a built-in engine, is refused."""
    with pytest.raises(ValueError, match="another endpoint"):
        parse_endpoints(["a=http://h:1", "a=http://h:2"])
    with pytest.raises(ValueError, match="built-in engine"):
        parse_endpoints(["continuous=http://h:1"], reserved=["continuous"])


def test_env_lists_endpoints_in_order():
    """CBP_ENDPOINTS is a comma list; unset or blank means none; errors name the variable, and
    built-in engine names are refused."""
    env = {"CBP_ENDPOINTS": "one=http://a:1, two=http://b:2/v1,"}
    assert endpoints_from_env(env) == [Endpoint("one", "http://a:1"), Endpoint("two", "http://b:2")]
    assert endpoints_from_env({}) == []
    assert endpoints_from_env({"CBP_ENDPOINTS": " "}) == []
    with pytest.raises(ValueError, match="CBP_ENDPOINTS"):
        endpoints_from_env({"CBP_ENDPOINTS": "one"})
    with pytest.raises(ValueError, match="built-in engine"):
        endpoints_from_env({"CBP_ENDPOINTS": "continuous=http://h:1"}, ["continuous"])


def test_a_record_url_joins_its_endpoint():
    """``NAME=RECORD_URL`` gives the named endpoint its record URL as written (no '/v1' cut) and
    leaves the others without one."""
    found = parse_endpoints(["gpu=http://10.0.0.5:8000/v1", "cpu=http://h:1"])
    joined = with_records(found, [" gpu = http://10.0.0.5:8100/ "])
    assert joined == [
        Endpoint("gpu", "http://10.0.0.5:8000", "http://10.0.0.5:8100"),
        Endpoint("cpu", "http://h:1"),
    ], joined


@pytest.mark.parametrize(
    ("items", "words"),
    [
        (["gpu"], "NAME=RECORD_URL"),
        (["gpu="], "NAME=RECORD_URL"),
        (["tpu=http://h:2"], "no endpoint is named 'tpu' .*--endpoint tpu=URL"),
        (["gpu=10.0.0.5:8100"], "http:// or https://"),
        (["gpu=http://h:123456"], "port"),
        (["gpu=http://h:2?since=0"], "query"),
        (["gpu=http://h:2", "gpu=http://h:3"], "has a record URL already"),
    ],
)
def test_bad_record_urls_are_refused_with_their_text(items, words):
    """A malformed ``--endpoint-record``, one for a name no endpoint has, or a second one for the
    same name raises ValueError quoting the entry and saying what to do."""
    with pytest.raises(ValueError, match=words) as info:
        with_records([Endpoint("gpu", "http://h:1")], items)
    assert repr(items[-1]) in str(info.value), f"message does not quote the entry: {info.value}"
