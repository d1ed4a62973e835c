"""A tiny random model saved as a Hugging Face folder (config, weights, SmolLM2's tokenizer, the shipped
chat template): what ``--model DIR`` takes, small enough that a training update runs in seconds on 2 cores."""

from __future__ import annotations

from pathlib import Path

from agentenv.models import chat_template
from tests.agents.tiny import tiny_smollm_lm
from tests.smollm_tokenizer import smollm_tokenizer


def write_tiny_model(folder: Path, seed: int = 0) -> Path:
    """Save a 1-layer random Llama over SmolLM2's vocabulary (about 0.8M parameters) into ``folder``."""
    tokenizer = smollm_tokenizer()
    tokenizer.chat_template = chat_template()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = tiny_smollm_lm(seed)
    model.generation_config.eos_token_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
