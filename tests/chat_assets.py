"""Real tokenizers and chat templates for the chat and tool-call tests (scripts/install_chat_assets.sh).

Each loader skips the calling test, naming the missing asset and the install command, when the asset
is absent; nothing is downloaded at test time. Loaded once per session.
"""

from __future__ import annotations

import os
from functools import cache, lru_cache
from pathlib import Path

import pytest

INSTALL = "bash scripts/install_chat_assets.sh"


def assets_dir() -> Path:
    """``$AGENTENV_CACHE/chat_assets`` (default ``~/.cache/agentenv/chat_assets``); not created here."""
    return Path(os.environ.get("AGENTENV_CACHE", Path.home() / ".cache" / "agentenv")) / "chat_assets"


def _folder(name: str) -> Path:
    folder = assets_dir() / name
    if not (folder / "tokenizer.json").is_file():
        pytest.skip(f"{name} tokenizer not installed at {folder} (run {INSTALL})")
    return folder


@cache
def _tokenizer(name: str):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(_folder(name)))


def hf_tokenizer(name: str):
    """The Hugging Face tokenizer ``name`` (``qwen3``, ``llama3_1``, ``deepseek_v3``, ``gptoss``)."""
    _folder(name)
    return _tokenizer(name)


def chat_template(name: str) -> str:
    """The family's chat template: ``chat_template.jinja`` beside the tokenizer, else its config's."""
    folder = _folder(name)
    file = folder / "chat_template.jinja"
    if file.is_file():
        return file.read_text()
    template = hf_tokenizer(name).chat_template
    if not template:
        pytest.skip(f"{name} has no chat template in {folder}")
    return template


def mistral_tokenizer():
    """mistral-common's v3 tokenizer (Mistral-7B-Instruct-v0.3's, with ``[TOOL_CALLS]``), shipped in the wheel."""
    pytest.importorskip("mistral_common", reason=f"mistral-common not installed (run {INSTALL})")
    return _mistral()


@lru_cache(maxsize=1)
def _mistral():
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.v3()


def harmony_encoding():
    """The gpt-oss harmony encoding of oss-harmony (its vocabulary ships inside the package)."""
    pytest.importorskip("openai_harmony", reason=f"oss-harmony not installed (run {INSTALL})")
    return _harmony()


@lru_cache(maxsize=1)
def _harmony():
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
