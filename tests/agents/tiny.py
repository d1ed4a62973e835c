"""A tiny random policy over the real SmolLM2 tokenizer: the real engine, chat template and learner, fast on 2 cores."""

from __future__ import annotations

from pathlib import Path

import torch

from agentenv.models import chat_template
from agentenv.rollout.chat import ChatRenderer
from tests.smollm_tokenizer import smollm_tokenizer

TEMPLATES = Path(__file__).resolve().parents[1] / "chat_templates"


def tiny_smollm_lm(seed: int = 0) -> torch.nn.Module:
    """A random 1-layer Llama with SmolLM2's vocabulary (49,152 ids), so the real tokenizer reads it."""
    import transformers

    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=len(smollm_tokenizer()), hidden_size=16, intermediate_size=32,
                                   num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=2048, tie_word_embeddings=True)
    return transformers.LlamaForCausalLM(cfg).eval()


def tool_renderer(**kw) -> ChatRenderer:
    """SmolLM2's tokenizer with the shipped tool-aware ChatML template (append-only)."""
    return ChatRenderer(smollm_tokenizer(), chat_template(), **kw)


def rewriting_renderer() -> ChatRenderer:
    """A template that drops every earlier assistant turn's content: each observation breaks the prefix."""
    return ChatRenderer(smollm_tokenizer(), (TEMPLATES / "rewriting.jinja").read_text())
