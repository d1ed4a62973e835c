"""What a peer's game needs besides its package, read from its source: against the real peers, offline."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import zipfile

import pytest

import agentenv
from agentenv.adapters import installed_specs, unavailable
from agentenv.adapters.needs import nltk_has, source_needs, unavailable_reason, unmet
from agentenv.errors import EnvUnavailable
from agentenv.registration_cli import list_envs_main

nltk = pytest.importorskip("nltk")

WORDS = "needs NLTK data 'words': python -m nltk.downloader words"
WORDLE = (
    "needs NLTK data 'averaged_perceptron_tagger_eng', 'words': "
    "python -m nltk.downloader averaged_perceptron_tagger_eng words"
)
ONLINE = "needs OPENROUTER_API_KEY set and network access: an online model plays the game master"


@pytest.fixture
def offline(monkeypatch, tmp_path) -> list[tuple]:
    """No NLTK data, no OpenRouter key, no network; returns the ``nltk.download`` calls attempted."""
    calls: list[tuple] = []

    def download(*args, **kwargs):
        calls.append(args or tuple(kwargs.values()))
        raise RuntimeError("nltk.download called offline")

    def connect(self, address):
        raise RuntimeError(f"network touched: {address}")

    (tmp_path / "nltk_data").mkdir()
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "nltk_data")])
    monkeypatch.setattr(nltk, "download", download)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    return calls


def write_package(root, files: dict[str, str]) -> None:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)


def test_needs_follow_the_games_imports_within_its_package(tmp_path, monkeypatch) -> None:
    write_package(
        tmp_path,
        {
            "fakepeer/__init__.py": "import nltk\nnltk.download('registry_only')\n",
            "fakepeer/games/__init__.py": "",
            "fakepeer/games/guess.py": (
                "import nltk, os\nfrom ..wordlists import load\nfrom fakepeer import board\nnltk.download(['a', 'b'])\n"
            ),
            "fakepeer/wordlists.py": "import nltk\ndef load():\n    nltk.download(info_or_id='c')\n",
            "fakepeer/board.py": "from fakepeer.games import guess\n",  # a cycle back to the game
            "fakepeer/master.py": "import fakepeer as fp\nclass M:\n    master = fp.agents.OpenRouterAgent()\n",
            "fakepeer/broken.py": "def f(:\n    pass\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert source_needs("fakepeer.games.guess") == ("nltk:a", "nltk:b", "nltk:c")
    assert source_needs("fakepeer.master") == ("online:OPENROUTER_API_KEY",)
    assert source_needs("fakepeer.broken") == ("compile:fakepeer/broken.py line 1: invalid syntax",)
    assert source_needs("fakepeer") == ("nltk:registry_only",)  # a package read as the game itself
    assert source_needs("fakepeer.nosuchmodule") == source_needs("nosuchpeer.game") == ()
    assert "fakepeer" not in sys.modules  # read, never imported


def test_nltk_data_is_found_where_nltk_looks_and_nowhere_else(offline, tmp_path, monkeypatch) -> None:
    data = tmp_path / "nltk_data"
    assert not nltk_has("words") and unmet(["nltk:words", "nltk:words"]) == ["nltk:words"]
    assert unavailable_reason(["nltk:words"]) == WORDS
    (data / "corpora" / "words").mkdir(parents=True)
    (data / "taggers").mkdir()
    with zipfile.ZipFile(data / "taggers" / "averaged_perceptron_tagger_eng.zip", "w") as z:  # zipped, as NLTK ships
        z.writestr("averaged_perceptron_tagger_eng/weights.json", "{}")
    assert nltk_has("words") and nltk_has("averaged_perceptron_tagger_eng") and not nltk_has("stopwords")
    assert unavailable_reason(["nltk:words", "nltk:averaged_perceptron_tagger_eng"]) is None
    assert unavailable_reason(["online:OPENROUTER_API_KEY"]) == ONLINE
    monkeypatch.setenv("OPENROUTER_API_KEY", "k")
    assert unavailable_reason(["online:OPENROUTER_API_KEY", "nltk:stopwords"]) == (
        "needs NLTK data 'stopwords': python -m nltk.downloader stopwords"
    )
    assert offline == []


def test_textarena_games_name_what_they_need(offline) -> None:
    pytest.importorskip("textarena")
    from agentenv.adapters.textarena_env import needs

    assert needs("GuessTheNumber-v0") == () and needs("Hangman-v0") == needs("WordSearch-v0-raw") == ("nltk:words",)
    assert needs("Wordle-v0") == ("nltk:averaged_perceptron_tagger_eng", "nltk:words")
    assert needs("GuessWho-v0") == needs("TwentyQuestions-v0") == ("online:OPENROUTER_API_KEY",)
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    if sys.version_info < (3, 12):
        assert unavailable_reason(needs("UltimateTexasHoldem-v0")) == (
            f"does not compile on Python {python}: textarena/envs/UltimateTexasHoldem/env.py line 228: "
            "f-string: unmatched '['"
        )
    assert unavailable_reason(needs("Klondike-v0")) == (
        f"does not compile on Python {python}: textarena/envs/Klondike/env.py line 119: invalid syntax"
    )
    found = unavailable()
    assert found["textarena/Wordle-v0"] == WORDLE and found["textarena/GuessWho-v0-raw"] == ONLINE
    assert "textarena/GuessTheNumber-v0" not in found and offline == []


def test_gem_games_name_what_they_need(offline) -> None:
    pytest.importorskip("gem")
    from agentenv.adapters.gem_env import needs

    assert needs("game:Hangman-v0") == needs("game:Wordle-v0-easy") == ("nltk:words",)
    assert needs("game:GuessTheNumber-v0") == ()
    assert unavailable()["gem/game:Hangman-v0-hard"] == WORDS and offline == []


def test_an_unavailable_game_is_refused_before_its_code_runs(offline) -> None:
    pytest.importorskip("textarena")
    for env_id, reason in (("textarena/Wordle-v0", WORDLE), ("textarena/TwentyQuestions-v0", ONLINE)):
        with pytest.raises(EnvUnavailable) as info:
            agentenv.make(env_id)
        assert str(info.value) == f"{env_id} cannot be built here: {reason}"
    if "gem/game:Hangman-v0" in {s.id for s in installed_specs()}:
        with pytest.raises(EnvUnavailable, match="gem/game:Hangman-v0 cannot be built here: needs NLTK data 'words'"):
            agentenv.make("gem/game:Hangman-v0")
    assert offline == []  # nothing tried to download


def test_agentenv_envs_marks_what_cannot_be_built_here(offline, capsys) -> None:
    pytest.importorskip("textarena")
    assert list_envs_main([]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["textarena/Hangman-v0"].endswith(f"(single player; reward at the end) (unavailable: {WORDS})")
    assert "unavailable" not in lines["textarena/GuessTheNumber-v0"] and "unavailable" not in lines["python_tool"]
    assert list_envs_main(["--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["textarena/Wordle-v0"]["unavailable"] == WORDLE
    assert rows["textarena/GuessTheNumber-v0"]["unavailable"] is None and rows["python_tool"]["unavailable"] is None


def one_id_per_module(registry, ids: list[str]) -> list[str]:
    """The shortest (plainest) id of each game module among ``ids``."""
    chosen: dict[str, str] = {}
    for i in sorted(ids, key=lambda i: (len(i), i)):
        chosen.setdefault(registry[i].entry_point.partition(":")[0], i)
    return sorted(chosen.values())


def built_offline(make) -> BaseException | None:
    """What building and resetting a peer's game raised offline (None: it played)."""
    state = random.getstate()
    try:
        make()
        return None
    except Exception as exc:  # the peer's own failure: a download refused, a SyntaxError, a missing key
        return exc
    finally:
        random.setstate(state)


def test_every_listed_textarena_game_builds_offline_unless_marked(offline) -> None:
    ta = pytest.importorskip("textarena")
    from agentenv.adapters.textarena_env import listed_ids, needs, textarena_registry

    games = one_id_per_module(textarena_registry(), listed_ids())
    assert len(games) >= 30
    outcomes = {g: built_offline(lambda g=g: ta.make(g).reset(num_players=1, seed=0)) for g in games}
    marked = {g for g in games if unavailable_reason(needs(g))}
    assert {g for g, error in outcomes.items() if error is not None} == marked, outcomes
    assert {g.split("-")[0] for g in marked} >= {"Hangman", "Wordle", "WordLadder", "WordSearch", "GuessWho"}
    assert {c for call in offline for c in call} == {"words", "averaged_perceptron_tagger_eng"}


def test_every_listed_gem_game_builds_offline_unless_marked(offline) -> None:
    gem = pytest.importorskip("gem")
    from agentenv.adapters.gem_env import gem_registry, listed_ids, needs

    games = one_id_per_module(gem_registry(), listed_ids())
    outcomes = {g: built_offline(lambda g=g: gem.make(g).reset(seed=0)) for g in games}
    marked = {g for g in games if unavailable_reason(needs(g))}
    assert (
        {g for g, error in outcomes.items() if error is not None} == marked == {"game:Hangman-v0", "game:Wordle-v0"}
    ), outcomes


def test_with_its_corpus_installed_a_game_is_listed_and_plays(tmp_path) -> None:
    pytest.importorskip("textarena")
    words = tmp_path / "nltk_data" / "corpora" / "words"
    words.mkdir(parents=True)
    (words / "en").write_text("apple\n")
    (words / "en-basic").write_text("apple\n")
    script = (
        "import asyncio, nltk, agentenv\n"
        "from agentenv.adapters import unavailable\n"
        "nltk.download = lambda *a, **k: True  # TextArena's Hangman calls it on import, data or not\n"
        "print(sorted(i for i in unavailable() if i.startswith('textarena/Hangman')))\n"
        "env = agentenv.make('textarena/Hangman-v0')\n"
        "asyncio.run(env.reset(options={'task': 0}))\n"
        "print(env.ta_env.state.game_state['target_word'])\n"
    )
    env = {**os.environ, "NLTK_DATA": str(tmp_path / "nltk_data"), "AGENTENV_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.splitlines() == ["[]", "apple"]
