"""``agentenv serve`` as a real process on loopback, spoken to with plain ``httpx``: the protocol and its bad input.

Every bad request gets a typed error (HTTP status + kind) and the server keeps serving: each case
ends by stepping a session that was open before it.
"""

from __future__ import annotations

import httpx
import pytest

from tests.remote.serving import GUESS_NUMBER_ID, running

pytestmark = [pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def server():
    # secrets 1..5, 3 guesses; small caps so that the limits are cheap to hit
    with running("--env-arg", "high=5", "--env-arg", "max_turns=3", "--max-action-chars", "64",
                 "--max-sessions", "6") as s:
        yield s


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=10.0) as client:
        yield client


def new_session(http, request_id: str, task: int = 0) -> dict:
    r = http.post("/sessions", json={"request_id": request_id, "seed": 0, "options": {"task": task}})
    assert r.status_code == 201, r.text
    return r.json()


def kind(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json()["error"]["kind"]


def still_serving(http, session: dict, step: int = 0) -> None:
    """The session opened before the bad request still plays (secret of task 0 is 1: "2" is wrong)."""
    r = http.post(f"/sessions/{session['session']}/step", json={"action": "2", "step": step})
    assert r.status_code == 200 and r.json()["observation"] == "Lower." and r.json()["step"] == step


def test_health_info_tasks(http):
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["env"] == GUESS_NUMBER_ID and health["protocol"] == 1
    info = http.get("/info").json()
    assert info["env"] == GUESS_NUMBER_ID and info["observation_role"] == "user" and info["cut_turn"] == "end"
    assert info["system_prompt"] == "Guess the secret number. Reply with one integer." and info["tools"] == []
    assert info["max_action_chars"] == 64
    assert http.get("/tasks").json() == {"tasks": {"ids": [f"secret-{n}" for n in range(1, 6)], "kinds": [""] * 5},
                                         "split": ""}


def test_an_episode_and_idempotent_repeats(http):
    first = new_session(http, "episode-1", task=2)  # secret 3
    assert first["observation"] == "I am thinking of an integer from 1 to 5. Guess it."
    assert first["info"] == {"task_id": "secret-3"} and first["tools"] == []
    again = http.post("/sessions", json={"request_id": "episode-1", "seed": 0, "options": {"task": 2}})
    assert again.status_code == 201 and again.json() == first  # a retried reset: the same session
    sid = first["session"]
    r0 = http.post(f"/sessions/{sid}/step", json={"action": "I guess 1", "step": 0}).json()
    assert r0 == {"observation": "Higher.", "reward": 0.0, "terminated": False, "truncated": False,
                  "info": {"turns": 1}, "step": 0}
    assert http.post(f"/sessions/{sid}/step", json={"action": "ignored", "step": 0}).json() == r0  # a retried step
    r1 = http.post(f"/sessions/{sid}/step", json={"action": "3", "step": 1}).json()
    assert (r1["observation"], r1["reward"], r1["terminated"], r1["step"]) == ("Correct!", 1.0, True, 1)
    # step after the episode ended: typed, and the last step can still be repeated
    assert kind(http.post(f"/sessions/{sid}/step", json={"action": "3", "step": 2})) == (409, "episode_over")
    assert http.post(f"/sessions/{sid}/step", json={"action": "3", "step": 1}).json() == r1
    assert http.delete(f"/sessions/{sid}").json() == {"closed": True}
    assert kind(http.delete(f"/sessions/{sid}")) == (404, "unknown_session")


@pytest.mark.parametrize(
    ("path", "content", "expected"),
    [
        ("/sessions", b"{not json", (400, "bad_request")),
        ("/sessions", b"[1, 2]", (400, "bad_request")),
        ("/sessions", b'{"seed": 1}', (400, "bad_request")),  # no request_id
        ("/sessions", b'{"request_id": "x", "seed": "one"}', (400, "bad_request")),
        ("/sessions", b'{"request_id": "x", "options": [1]}', (400, "bad_request")),
        ("/sessions", b"\xff\xfe", (400, "bad_request")),
        ("STEP", b"{not json", (400, "bad_request")),
        ("STEP", b'{"action": 3, "step": 0}', (400, "bad_request")),
        ("STEP", b'{"action": "3"}', (400, "bad_request")),
        ("STEP", b'{"action": "3", "step": true}', (400, "bad_request")),
        ("STEP", b'{"action": "3", "step": 5}', (409, "out_of_order")),
        ("/sessions/no-such-session/step", b'{"action": "3", "step": 0}', (404, "unknown_session")),
    ],
)
def test_malformed_bodies_and_unknown_sessions_are_typed_errors(http, path, content, expected):
    victim = new_session(http, f"victim-{path}-{content!r}")  # where the bad request lands
    bystander = new_session(http, f"bystander-{path}-{content!r}")
    target = f"/sessions/{victim['session']}/step" if path == "STEP" else path
    r = http.post(target, content=content, headers={"content-type": "application/json"})
    assert kind(r) == expected and r.json()["error"]["message"]
    still_serving(http, bystander)
    if path == "STEP":
        still_serving(http, victim)  # a refused step does not count: step 0 is still next
    for s in (victim, bystander):
        http.delete(f"/sessions/{s['session']}")


def test_oversized_action_and_body_are_refused(http):
    session = new_session(http, "big")
    sid = session["session"]
    r = http.post(f"/sessions/{sid}/step", json={"action": "9" * 65, "step": 0})
    assert kind(r) == (413, "too_large") and "64" in r.json()["error"]["message"]
    # a body past the byte cap is refused before it is parsed (6 * 64 + 4096 bytes)
    r = http.post(f"/sessions/{sid}/step", content=b'{"action": "' + b"9" * 10_000 + b'", "step": 0}')
    assert kind(r) == (413, "too_large")
    still_serving(http, session)  # the refused steps did not count
    http.delete(f"/sessions/{sid}")


def test_unknown_route_method_and_capacity(http):
    assert kind(http.get("/nowhere")) == (404, "not_found")
    assert kind(http.get("/sessions")) == (405, "method_not_allowed")
    open_before = http.get("/health").json()["sessions"]
    held = [new_session(http, f"cap-{i}") for i in range(6 - open_before)]
    r = http.post("/sessions", json={"request_id": "one-too-many", "seed": 0})
    assert kind(r) == (503, "capacity")
    still_serving(http, held[0])
    for s in held:
        http.delete(f"/sessions/{s['session']}")
    assert http.get("/health").json()["sessions"] == open_before


def test_an_env_error_fails_only_its_session(http):
    # the env refuses a task index out of range: typed env_error, other sessions unaffected
    bystander = new_session(http, "bystander-env-error")
    r = http.post("/sessions", json={"request_id": "bad-task", "seed": 0, "options": {"task": 99}})
    assert kind(r) == (500, "env_error") and "ConfigError" in r.json()["error"]["message"]
    still_serving(http, bystander)
    http.delete(f"/sessions/{bystander['session']}")


def test_ctrl_c_stops_the_server_with_one_line_and_no_traceback():
    import signal as signals

    from tests.remote.serving import launch, wait_ready

    proc = launch()
    try:
        url = wait_ready(proc)
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200  # uvicorn is serving, a session open
        body = {"request_id": "r1", "seed": 0, "options": {"task": 0}}
        assert httpx.post(f"{url}/sessions", json=body, timeout=10).status_code == 201
        proc.send_signal(signals.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 130
    assert err.strip().splitlines() == ["agentenv serve: stopped"]


def test_a_peer_id_that_envs_lists_is_served_with_a_plain_command():
    pytest.importorskip("reasoning_gym")
    with running(env_id="reasoning_gym/gcd") as server:
        info = httpx.get(f"{server.url}/info", timeout=10).json()
        tasks = httpx.get(f"{server.url}/tasks", timeout=10).json()["tasks"]
    assert (info["env"], info["cut_turn"]) == ("reasoning_gym/gcd", "end")
    assert tasks["ids"][:2] == ["gcd/0", "gcd/1"]
