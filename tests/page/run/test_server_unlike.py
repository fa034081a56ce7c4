"""The local vLLM's settings are fixed when the page starts: a run whose engines differ from it in
prefix caching gets a warning line, like one in other slots or another precision."""

from __future__ import annotations

from types import SimpleNamespace

from engine.page.run import host_servers
from engine.peers.vllm_server import VllmSettings


def _servers(prefix_caching: bool | None) -> host_servers.PageServers:
    """A page's servers with a local vLLM (not started) whose prefix caching is as given."""
    settings = VllmSettings("model", "float32", 3, prefix_caching=prefix_caching)
    local = SimpleNamespace(server=SimpleNamespace(settings=settings))
    return host_servers.PageServers({"vllm": local, "remote": SimpleNamespace()})


def test_a_run_without_prefix_caching_beside_vllms_default_is_warned():
    """vLLM caches prefixes by default; our engines without it: one line naming both."""
    (line,) = host_servers._prefix_warnings(_servers(None), "vllm", False)
    assert "vllm caches prompt prefixes" in line and "engines did not" in line, line


def test_the_other_way_round_is_warned_too():
    (line,) = host_servers._prefix_warnings(_servers(False), "vllm", True)
    assert "vllm does not cache prompt prefixes" in line and "engines did (" in line, line


def test_alike_settings_an_endpoint_and_an_unknown_setting_are_not_warned():
    assert host_servers._prefix_warnings(_servers(None), "vllm", True) == []
    assert host_servers._prefix_warnings(_servers(False), "vllm", False) == []
    assert host_servers._prefix_warnings(_servers(None), "remote", False) == []
    assert host_servers._prefix_warnings(_servers(None), "vllm", None) == []
