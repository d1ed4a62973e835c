"""The token rule: loopback unless told otherwise; anything else needs a token, and then every request does."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from agentenv.errors import ConfigError, RemoteEnvError
from agentenv.remote import RemoteEnv
from agentenv.remote.server import ServeConfig, is_loopback
from tests.remote.serving import GUESS_NUMBER_ID, launch, running

pytestmark = [pytest.mark.timeout(120)]


def test_loopback_hosts():
    assert [is_loopback(h) for h in ("127.0.0.1", "127.8.0.1", "::1", "localhost")] == [True] * 4
    assert [is_loopback(h) for h in ("0.0.0.0", "::", "10.0.0.1", "example.org")] == [False] * 4


def test_a_non_loopback_host_without_a_token_refuses_to_start():
    with pytest.raises(ConfigError, match="not loopback: serving it needs a token"):
        ServeConfig(env_id="x", host="0.0.0.0")
    assert ServeConfig(env_id="x", host="0.0.0.0", token="t").token == "t"  # allowed with one
    proc = launch("--host", "0.0.0.0", extra_env={"AGENTENV_REMOTE_TOKEN": ""})
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 1 and out == ""  # never bound, never printed a URL
    assert "host '0.0.0.0' is not loopback: serving it needs a token" in err


def test_with_a_token_every_request_needs_it():
    token = "s3cret-token"
    with running(extra_env={"AGENTENV_REMOTE_TOKEN": token}) as server:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
            for method, path in (("GET", "/health"), ("GET", "/tasks"), ("POST", "/sessions")):
                r = httpx.request(method, server.url + path, headers=headers, json={"request_id": "a"}, timeout=10)
                assert r.status_code == 401 and r.json()["error"]["kind"] == "unauthorized"
        ok = httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert ok.status_code == 200 and ok.json()["sessions"] == 0
        # the client: without the token it fails at construction, typed; with it, it plays
        with pytest.raises(RemoteEnvError) as caught:
            RemoteEnv(GUESS_NUMBER_ID, server.url, token="")
        assert (caught.value.kind, caught.value.status) == ("unauthorized", 401)
        env = RemoteEnv(GUESS_NUMBER_ID, server.url, token=token)
        assert len(env.tasks()) == 100
