"""``agentenv export``: a training run's checkpoint as a Hugging Face model folder.

A checkpoint (``RUN/checkpoints/vN/``) holds the policy's weights (``model.safetensors``) and the
optimizer, but not the model's config, tokenizer or chat template: those are the base model's
(``model.name`` in ``RUN/config.yaml``). The export writes them together::

    OUT/
      config.json, generation_config.json    # the base model's (dtype: the checkpoint's)
      tokenizer files, chat template          # the tokenizer the run trained with
      model.safetensors                       # the checkpoint's weights, unchanged
      agentenv_export.json                    # run, version, base model, env, chat-template variables

so that ``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` and ``agentenv eval --model OUT`` load it
(the layout vLLM reads too). The weights file is streamed (its header rewritten with the ``format: pt`` metadata
transformers asks for), so a 7B export needs no more memory than a small one. A LoRA run's weights
(``learner.lora_rank > 0``) are merged into the base weights first
(:func:`agentenv.trainer.learners.lora.merged_state_dict`),
which holds them in memory once. With ``adapter=True`` (``--adapter``) a LoRA run is written as a peft
adapter instead, to be loaded over the base model (``peft.PeftModel.from_pretrained(base, OUT)``, or
vLLM's ``LoRARequest``)::

    OUT/
      adapter_config.json                     # peft's LoraConfig: r, lora_alpha, target_modules, base model
      adapter_model.safetensors               # the adapter tensors under peft's names
      tokenizer files, chat template, agentenv_export.json
"""

from __future__ import annotations

import json
import shutil
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import tyro

from agentenv.errors import AgentEnvError, CheckpointError, ConfigError, RunFolderError
from agentenv.output_folders import EXPORT, RUN, claim_folder

#: Bytes copied at a time when streaming the weights.
_CHUNK = 64 << 20


def find_checkpoint(run: Path, version: int | None) -> Path:
    """The checkpoint folder of ``run`` at policy ``version`` (None: the latest).

    Raises:
        RunFolderError: ``run`` is not a training run folder (no run.json or config.yaml).
        CheckpointError: The run has no checkpoint, or none at ``version`` (the message lists those it has).
    """
    from agentenv.trainer.checkpoint import latest_checkpoint, list_checkpoints, read_meta

    if not RUN.holds(run) or not (run / "config.yaml").is_file():
        raise RunFolderError(f"{run} is not an agentenv training run folder (no run.json and config.yaml)")
    root = run / "checkpoints"
    if version is None:
        latest = latest_checkpoint(root)
        if latest is None:
            raise CheckpointError(f"{run} has no checkpoint yet (run.checkpoint_every; the last update is saved "
                                  "when a run ends)")
        return latest
    found = {int(read_meta(p)["version"]): p for p in list_checkpoints(root)}
    if version not in found:
        held = ", ".join(map(str, sorted(found))) or "none"
        raise CheckpointError(f"{run} has no checkpoint of version {version} (it has: {held}; a run keeps "
                              "its last 2 checkpoints)")
    return found[version]


def copy_safetensors(src: Path, dst: Path, metadata: dict[str, str]) -> None:
    """Copy a safetensors file with its ``__metadata__`` replaced by ``metadata``; tensors are streamed.

    The file is an 8-byte little-endian header length, a JSON header (tensor name -> dtype, shape,
    offsets into the data section), then the data; offsets are relative to the data section, so a new
    header of another length leaves them valid.

    Raises:
        CheckpointError: ``src`` is not a safetensors file.
    """
    with src.open("rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise CheckpointError(f"{src}: not a safetensors file (shorter than its header)")
        (size,) = struct.unpack("<Q", head)
        try:
            header = json.loads(f.read(size))
        except (ValueError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{src}: not a safetensors file ({e})") from e
        header["__metadata__"] = dict(metadata)
        body = json.dumps(header, separators=(",", ":")).encode()
        body += b" " * (-len(body) % 8)  # the data section stays 8-byte aligned
        with dst.open("wb") as out:
            out.write(struct.pack("<Q", len(body)))
            out.write(body)
            shutil.copyfileobj(f, out, _CHUNK)


def _checkpoint_dtype(path: Path) -> str:
    """The dtype name (``float32``, ``bfloat16``, ...) of the checkpoint's floating-point tensors."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    names = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
    found = [names[v["dtype"]] for k, v in header.items() if k != "__metadata__" and v["dtype"] in names]
    return max(set(found), key=found.count) if found else "float32"


def _tensor_names(path: Path) -> set[str]:
    """The tensor names in a safetensors file's header."""
    with path.open("rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return set(json.loads(f.read(size))) - {"__metadata__"}


def _check_keys(checkpoint: Path, held: set[str], config: Any) -> None:
    """Refuse weights whose names do not fit the base model's architecture (built on the meta device)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        wanted = set(AutoModelForCausalLM.from_config(config).state_dict())
    missing = sorted(wanted - held - {"lm_head.weight"})  # a tied head is the embedding
    if missing:
        raise CheckpointError(f"{checkpoint}: the weights do not fit the base model {config.model_type!r} "
                              f"({len(missing)} tensors missing, e.g. {missing[0]!r})")


def export(run: Path, out: Path, *, version: int | None = None, overwrite: bool = False,
           adapter: bool = False) -> Path:
    """Write the checkpoint of ``run`` at ``version`` (None: the latest) as a model folder ``out``; return it.

    Args:
        run: The training run folder.
        out: The folder to write (new, empty, or an earlier export with ``overwrite``).
        version: The checkpoint's policy version; None: the latest.
        overwrite: Replace an earlier export in ``out``.
        adapter: Write a LoRA run's adapters alone, as a peft adapter folder (see the module docstring);
            False: the merged model.

    Raises:
        RunFolderError: ``run`` is not a run folder; ``out`` holds files and is not an earlier export
            (or is one and ``overwrite`` is False).
        CheckpointError: No such checkpoint, or weights that do not fit the base model.
        ConfigError: The base model (``model.name`` of the run's config) cannot be found; ``adapter``
            for a run that trained every weight.
    """
    import yaml
    from transformers import AutoConfig, AutoTokenizer

    from agentenv.models import DEFAULT_ALIASES, chat_template, resolve_model_path
    from agentenv.trainer.checkpoint import read_meta

    checkpoint = find_checkpoint(run, version)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    model_cfg = cfg.get("model") or {}
    name = model_cfg.get("name")
    base = resolve_model_path(name)
    config = AutoConfig.from_pretrained(base, local_files_only=True)
    weights = checkpoint / "model.safetensors"
    learner = cfg.get("learner") or {}
    lora_rank = int(learner.get("lora_rank") or 0)
    if adapter and not lora_rank:
        raise ConfigError(f"--adapter: {run} trained every weight (learner.lora_rank 0), so it has no adapter; "
                          "export it without --adapter")
    merged = None
    if lora_rank:  # a LoRA run: the adapters merged into the base weights, under the base model's names
        from safetensors.torch import load_file

        from agentenv.trainer.learners.lora import merged_state_dict

        merged = merged_state_dict(load_file(str(weights)), rank=lora_rank, alpha=float(learner["lora_alpha"]))
    _check_keys(weights, set(merged) if merged is not None else _tensor_names(weights), config)
    out = claim_folder(out, EXPORT, overwrite=overwrite)
    tokenizer = AutoTokenizer.from_pretrained(base, local_files_only=True)
    if name is None or str(name) in DEFAULT_ALIASES:  # the run rendered with the tool-aware template
        tokenizer.chat_template = chat_template()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.save_pretrained(out)
    if adapter:
        from safetensors.torch import load_file

        from agentenv.engines.peft_adapter import write_peft_adapter

        write_peft_adapter(load_file(str(weights)), out, rank=lora_rank, alpha=float(learner["lora_alpha"]), base=base)
    else:
        _write_model(weights, merged, out, config, base)
    meta = read_meta(checkpoint)
    (out / EXPORT.sign).write_text(json.dumps({
        "run": str(run.resolve()), "version": int(meta["version"]), "checkpoint": checkpoint.name,
        "base_model": str(base), "adapter": adapter, "env": (cfg.get("env") or {}).get("id"),
        "chat_template_kwargs": model_cfg.get("chat_template_kwargs") or {},
    }, indent=2) + "\n")
    return out


def _write_model(weights: Path, merged: dict[str, Any] | None, out: Path, config: Any, base: Path | str) -> None:
    """``config.json``, ``generation_config.json`` and ``model.safetensors`` (the checkpoint's, or ``merged``)."""
    from transformers import GenerationConfig

    config.torch_dtype = _checkpoint_dtype(weights)
    config.save_pretrained(out)
    try:
        GenerationConfig.from_pretrained(base, local_files_only=True).save_pretrained(out)
    except OSError:  # the base has none: transformers' defaults apply
        pass
    if merged is None:
        copy_safetensors(weights, out / "model.safetensors", {"format": "pt"})
    else:
        from safetensors.torch import save_file

        save_file(merged, str(out / "model.safetensors"), metadata={"format": "pt"})


@dataclass(frozen=True)
class ExportArgs:
    """``agentenv export``'s options.

    Attributes:
        run: The run folder (train's --run-dir).
        out: The model folder to write (new, empty or an earlier export).
        version: Policy version to export (default: the latest checkpoint).
        overwrite: Replace an earlier export in the --out folder.
        adapter: A LoRA run's adapters alone, as a peft adapter folder (peft's PeftModel and vLLM's
            LoRARequest load it over the base model); default: the merged model.
    """

    run: Annotated[Path, tyro.conf.Positional, tyro.conf.arg(metavar="RUN")]
    out: Path
    version: int | None = None
    overwrite: bool = False
    adapter: bool = False


def main(argv: list[str] | None = None) -> int:
    """``agentenv export RUN [--version N] --out DIR``; exit status 0, or 2 with a one-line reason."""
    from agentenv.cli_args import parse

    args = parse(ExportArgs, sys.argv[1:] if argv is None else argv, prog="agentenv export",
                 description="Write a training run's checkpoint as a Hugging Face model folder (config, tokenizer, "
                             "chat template, weights) that transformers and `agentenv eval --model DIR` load. "
                             "Example: agentenv export runs/python_tool_cpu --out models/python_tool_v20")
    if isinstance(args, int):
        return args
    try:
        out = export(args.run, args.out, version=args.version, overwrite=args.overwrite, adapter=args.adapter)
    except AgentEnvError as exc:
        print(f"agentenv export: {exc}", file=sys.stderr)
        return 2
    meta = json.loads((out / EXPORT.sign).read_text())
    hint = "".join(f" --chat-template-kwarg {k}={json.dumps(v)}" for k, v in meta["chat_template_kwargs"].items())
    if meta["adapter"]:
        print(f"exported the adapters of version {meta['version']} of {args.run} to {out}\n"
              f"load them over the base model {meta['base_model']}: "
              f"peft.PeftModel.from_pretrained(base, {str(out)!r}), or vLLM's LoRARequest; "
              "`agentenv export` without --adapter writes the merged model")
        return 0
    print(f"exported version {meta['version']} of {args.run} to {out}\n"
          f"evaluate it: agentenv eval --env {meta['env']} --model {out}{hint}")
    return 0
