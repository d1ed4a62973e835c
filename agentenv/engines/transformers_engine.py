"""A continuous-batching generation engine on plain transformers models (CPUs, tests, small GPUs).

Requests from many coroutines are served by one background thread (so the event loop keeps stepping
environments) that runs incremental decoding with a left-padded batch KV cache
(:mod:`agentenv.engines.kv_cache`): each new request is prefilled alone and joins the batch, then all
active rows advance one token per forward pass. ``model.generate`` is not used.

Weight updates land between two decode steps (a token boundary). With ``ContinuationMode.KEEP`` the
rows keep their KV cache: the next tokens get ``version`` = new and ``prefix_version`` = the oldest
version that computed cached entries. With ``RECOMPUTE`` each row's prompt plus the tokens generated
so far is prefilled again under the new weights (``prefix_version == version``). Output spans split
exactly at the token where the update landed, and a row's budget stays ``max_new_tokens`` minus the
tokens it already has.

An engine may instead decode with a learner's own parameters (:meth:`TransformersEngine.serve_in_place`,
:mod:`agentenv.engines.shared_weights`): each decoding step then reads them under the learner's lock,
and a new version is seen at the first step after the learner's optimizer step, with no copy.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import queue
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from agentenv.engines import kv_cache
from agentenv.engines.base import ContinuationMode, GenerationOutput, SamplingParams, TokenSpan
from agentenv.engines.prompt_caches import TURN_CACHE_BYTES, PrefixCache, TurnCache
from agentenv.engines.sampling import processed_logprobs, sample, top_alternatives, validate_params
from agentenv.engines.shared_weights import SharedWeights, share_parameters
from agentenv.engines.weights import check_state_dict, copy_into, load_weights
from agentenv.errors import ClosedError, ConfigError, EngineDied, EngineError, WeightUpdateError
from agentenv.faults import fault_point


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    params: SamplingParams
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    generator: torch.Generator | None
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)  # params.top_logprobs > 0 only
    spans: list[TokenSpan] = field(default_factory=list)
    n_cached: int = 0  # real positions in this row's KV cache
    cache_version: int = 0  # oldest version that computed an entry of this row's cache
    cancelled: bool = False


@dataclass(eq=False)
class _Update:
    state: dict[str, torch.Tensor]
    version: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future


def _resolve(
    req_loop: asyncio.AbstractEventLoop,
    fut: asyncio.Future,
    result: Any = None,
    error: Exception | None = None,
):
    def _set() -> None:
        if fut.done():
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    try:
        req_loop.call_soon_threadsafe(_set)
    except RuntimeError:  # the caller's loop is closed; nobody is waiting any more
        pass


class TransformersEngine:
    """Batched sampling with partial-rollout continuation on a transformers causal LM.

    Implements :class:`agentenv.engines.base.GenerationEngine`.

    Args:
        model: A causal LM with full-attention layers (Llama, Qwen2, ...); its device and dtype are used.
        tokenizer: Optional; only used for its ``eos_token_id`` in :attr:`default_stop_token_ids`.
        max_batch_size: Most rows decoded together; further requests wait (rows).
        continuation: What happens to in-flight KV caches on a weight update.
        max_context_tokens: Prompt + output limit (tokens); default ``model.config.max_position_embeddings``.
        seed: Seeds the engine generator that requests without their own seed draw from.
        version: Policy version of the initial weights.
        turn_cache: Finished replies' KV caches kept for the episode's next turn
            (:class:`~agentenv.engines.prompt_caches.TurnCache`);
            default ``2 * max_batch_size``; 0 disables it.
        turn_cache_bytes: Most bytes those caches hold together (bytes; the oldest dropped first);
            default :data:`TURN_CACHE_BYTES` (128 MiB); None: bounded by ``turn_cache`` entries only.

    Raises:
        ConfigError: A non-positive batch size or context limit.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any = None,
        *,
        max_batch_size: int = 32,
        continuation: ContinuationMode = ContinuationMode.KEEP,
        max_context_tokens: int | None = None,
        seed: int = 0,
        version: int = 0,
        turn_cache: int | None = None,
        turn_cache_bytes: int | None = TURN_CACHE_BYTES,
    ) -> None:
        if max_batch_size < 1:
            raise ConfigError(f"max_batch_size must be >= 1, got {max_batch_size}")
        limit = max_context_tokens or getattr(model.config, "max_position_embeddings", None)
        if not limit or limit < 1:
            raise ConfigError(f"max_context_tokens must be >= 1, got {limit}")
        self._model = model.eval()
        self._tokenizer = tokenizer
        self._max_batch = max_batch_size
        self._continuation = ContinuationMode(continuation)
        self._max_context = int(limit)
        self._device = next(model.parameters()).device
        self._generator = torch.Generator(device=self._device).manual_seed(seed)
        self._version = version
        params = inspect.signature(model.forward).parameters
        self._cache_kw = kv_cache.cache_keyword(model)
        # Only the last position's logits are used: skip the vocabulary projection of the rest of a prefill.
        self._last_logits_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.num_steps = 0
        """Decode steps (batched forward passes after prefill) run so far; for tests and benchmarks."""
        self.num_prefills = 0
        """Prefill forward passes run so far (including RECOMPUTE re-prefills)."""
        self.num_prefix_hits = 0
        """Prefills that reused the shared prompt prefix's KV cache (:class:`~.prompt_caches.PrefixCache`)."""
        self.prefill_tokens = 0
        """Prompt tokens actually computed by prefills (tokens; the shared prefix's reuses excluded)."""
        self._shared = PrefixCache()
        self._turns = TurnCache(2 * max_batch_size if turn_cache is None else turn_cache, turn_cache_bytes)
        self.num_turn_hits = 0
        """Prefills that continued a finished reply's KV cache (:class:`~.prompt_caches.TurnCache`)."""
        self._in_place: SharedWeights | None = None

    # ------------------------------------------------------------------ public API
    @property
    def version(self) -> int:
        """The policy version of the weights now serving requests."""
        return self._in_place.version if self._in_place is not None else self._version

    @property
    def shared_weights(self) -> SharedWeights | None:
        """The learner's lock when this engine decodes the learner's parameters in place (else None)."""
        return self._in_place

    def serve_in_place(self, learner_model: torch.nn.Module, weights: SharedWeights) -> None:
        """Decode with the learner's own parameters, as it writes them under ``weights``' lock.

        The served model's parameters are replaced by ``learner_model``'s (the same tensors,
        :func:`agentenv.engines.shared_weights.share_parameters`; its own copy is dropped). Each
        decoding step (prefills included) reads them inside ``weights.reading()`` and records its
        tokens with the version it yields; a version newer than the last step's is served as a weight
        update would be (the turn caches dropped; under ``RECOMPUTE`` the rows in flight prefilled
        again). :meth:`update_weights` then takes no weights.

        Raises:
            EngineError: Requests were served already (call it right after construction).
            WeightUpdateError: ``learner_model``'s parameter names or shapes differ from the served model's.
        """
        if self._thread is not None:
            raise EngineError("serve_in_place must be called before the engine serves its first request")
        share_parameters(learner_model, self._model)
        self._in_place = weights
        self._version = weights.version

    @property
    def max_context_tokens(self) -> int:
        """Longest prompt + output served (tokens)."""
        return self._max_context

    @property
    def continuation(self) -> ContinuationMode:
        """How in-flight requests continue after a weight update."""
        return self._continuation

    @property
    def model(self) -> torch.nn.Module:
        """The served model (changed only by :meth:`update_weights`, or by the learner under :meth:`serve_in_place`)."""
        return self._model

    @property
    def default_stop_token_ids(self) -> tuple[int, ...]:
        """The tokenizer's end-of-sequence id as a 1-tuple (empty without a tokenizer)."""
        eos = getattr(self._tokenizer, "eos_token_id", None)
        return (int(eos),) if eos is not None else ()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationOutput:
        """Sample a continuation of ``prompt_ids`` (see the module docstring for versions and spans).

        Args:
            prompt_ids: ``(P,)`` token ids, ``1 <= P <= max_context_tokens``.
            params: Sampling settings; ``seed`` makes the draw independent of the other rows.

        Returns:
            The sampled ids, behaviour log-probabilities (processed distribution, float32, nats) and spans.
            A prompt of exactly ``max_context_tokens`` gets zero tokens, ``finish_reason="length"`` and
            ``truncated_context=True``.

        Raises:
            ConfigError: Bad sampling settings.
            ClosedError: The engine was closed.
            EngineError: Empty or over-long prompt, an out-of-vocabulary id, or a prefill failed.
            EngineDied: The decode thread died or a decode step failed while this request was in flight
                (a later request starts a fresh thread; ``SupervisedEngine`` rebuilds the engine).
        """
        validate_params(params)
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise EngineError("cannot generate from an empty prompt")
        vocab = self._model.get_input_embeddings().num_embeddings
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise EngineError(f"prompt holds token ids outside the vocabulary [0, {vocab})")
        if len(prompt) > self._max_context:
            raise EngineError(f"prompt of {len(prompt)} tokens exceeds the context limit {self._max_context}")
        if len(prompt) == self._max_context or params.max_new_tokens == 0:
            full = len(prompt) == self._max_context
            return GenerationOutput([], [], [], finish_reason="length", truncated_context=full,
                                    top_logprobs=[] if params.top_logprobs else None)
        self._ensure_running()
        loop = asyncio.get_running_loop()
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self._device).manual_seed(params.seed)
        req = _Request(prompt, params, loop, loop.create_future(), gen)
        self._inbox.put(("request", req))
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled = True
            raise

    async def update_weights(self, weights: Mapping[str, torch.Tensor] | Path, version: int) -> None:
        """Swap in new weights at the next token boundary as policy ``version``.

        The file is read and checked off the decode thread; the decode thread only copies tensors
        between two steps (and, in RECOMPUTE mode, re-prefills the in-flight rows). An engine that
        decodes the learner's parameters in place (:meth:`serve_in_place`) holds every version the
        learner writes: it returns at once when ``version`` is the learner's.

        Args:
            weights: A state dict or a safetensors file (names as in ``model.state_dict()``).
            version: New policy version; must exceed the serving one.

        Raises:
            WeightUpdateError: Unreadable file, unknown/missing names, shape mismatch, non-finite values
                or a version that does not increase; the previous version keeps serving. In place: any
                ``version`` but the learner's.
            ClosedError: The engine was closed.
        """
        if self._closed:
            raise ClosedError("engine is closed")
        if self._in_place is not None:
            if version != self._in_place.version:
                raise WeightUpdateError(f"this engine decodes the learner's parameters in place (version "
                                        f"{self._in_place.version}); it cannot load version {version}")
            return
        if version <= self._version:
            raise WeightUpdateError(f"new version {version} must exceed the serving version {self._version}")
        state = await asyncio.to_thread(load_weights, weights)
        await asyncio.to_thread(check_state_dict, self._model, state)
        self._ensure_running()
        loop = asyncio.get_running_loop()
        upd = _Update(state, version, loop, loop.create_future())
        self._inbox.put(("update", upd))
        await upd.future

    async def close(self) -> None:
        """Stop the decode thread; in-flight requests fail with EngineError. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        thread = self._thread
        if thread is not None and thread.is_alive():
            self._inbox.put(("stop", None))
            await asyncio.to_thread(thread.join, 30.0)

    # ------------------------------------------------------------------ decode thread
    def _ensure_running(self) -> None:
        if self._closed:
            raise ClosedError("engine is closed")
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="TransformersEngine", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        waiting: list[_Request] = []
        batch = _Batch()
        try:
            with torch.inference_mode():
                while True:
                    idle = not waiting and not batch.rows
                    cmds = [self._inbox.get()] if idle else []
                    while True:
                        try:
                            cmds.append(self._inbox.get_nowait())
                        except queue.Empty:
                            break
                    for kind, item in cmds:
                        if kind == "stop":
                            self._fail_all(waiting, batch, EngineError("engine closed"))
                            return
                        if kind == "request":
                            waiting.append(item)
                        else:
                            self._apply_update(item, batch)
                    waiting = [r for r in waiting if not r.cancelled]
                    with self._reading(batch):
                        self._admit(waiting, batch)
                        if batch.rows:  # tests: AGENTENV_FAULT=engine.decode:K (or :vV) kills the thread here
                            fault_point("engine.decode", self._version)
                            self._step(batch)
        except BaseException as exc:  # the thread must not die silently: fail what it holds
            self._fail_all(waiting, batch, EngineDied(f"decode thread died: {exc!r}"))
            raise

    @contextmanager
    def _reading(self, batch: _Batch) -> Iterator[None]:
        """Around one decoding step; in place, inside the learner's read lock, at the version it gives."""
        if self._in_place is None:
            yield
            return
        with self._in_place.reading() as version:
            if version != self._version:  # the learner stepped: its parameters hold a new version
                self._serve(version, batch)
            yield

    def _fail_all(self, waiting: list[_Request], batch: _Batch, error: EngineError) -> None:
        for r in [*waiting, *batch.rows]:
            _resolve(r.loop, r.future, error=error)
        waiting.clear()
        batch.reset()
        while True:  # requests and updates still queued
            try:
                kind, item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind in ("request", "update"):
                _resolve(item.loop, item.future, error=error)

    def _forward(self, input_ids: torch.Tensor, cache: DynamicCache, **kw: Any) -> torch.Tensor:
        out = self._model(input_ids=input_ids, use_cache=True, **{self._cache_kw: cache}, **self._last_logits_kw, **kw)
        return out.logits[:, -1, :]

    def _prefill(self, req: _Request, ids: list[int]) -> tuple[DynamicCache, torch.Tensor]:
        shared = self._shared
        turn = self._turns.take(ids, self._version)
        n = len(shared.ids) if shared.serves(ids, self._version) else 0
        if turn is not None:  # the episode's previous turn: only the reply's last token and the observation
            cache, n = turn
            logits = self._forward(torch.tensor([ids[n:]], device=self._device), cache)
            self.num_turn_hits += 1
        elif n:  # the system prompt and tool schemas every episode starts with: computed once per version
            cache = copy.deepcopy(shared.cache)
            logits = self._forward(torch.tensor([ids[n:]], device=self._device), cache)
            self.num_prefix_hits += 1
        else:
            cache = DynamicCache(config=self._model.config)
            logits = self._forward(torch.tensor([ids], device=self._device), cache)
            kv_cache.check_plain_layers(cache)
            shared.remember(ids, cache, self._version)
        self.prefill_tokens += len(ids) - n
        self.num_prefills += 1
        req.n_cached = len(ids)
        req.cache_version = self._version
        return cache, logits

    def _admit(self, waiting: list[_Request], batch: _Batch) -> None:
        new: list[tuple[_Request, DynamicCache]] = []
        while waiting and len(batch.rows) + len(new) < self._max_batch:
            req = waiting.pop(0)
            try:
                cache, logits = self._prefill(req, req.prompt)
                if not self._sample_and_check([req], logits)[0]:
                    new.append((req, cache))
            except Exception as exc:
                _resolve(req.loop, req.future, error=EngineError(f"prefill failed: {exc!r}"))
        if new:
            batch.add([r for r, _ in new], [c for _, c in new])

    def _step(self, batch: _Batch) -> None:
        rows = batch.rows
        try:
            total = batch.length + 1
            ids = torch.tensor([[r.tokens[-1]] for r in rows], device=self._device)
            pos = torch.tensor([[r.n_cached] for r in rows], device=self._device)
            mask = kv_cache.attention_mask([r.n_cached + 1 for r in rows], total, self._device)
            logits = self._forward(ids, batch.cache, attention_mask=mask, position_ids=pos)
            self.num_steps += 1
            batch.length = total
            for r in rows:
                r.n_cached += 1
            done = self._sample_and_check(rows, logits)
        except Exception as exc:
            error = EngineDied(f"generation failed mid-request: {exc!r}")
            for r in rows:
                _resolve(r.loop, r.future, error=error)
            batch.reset()
            return
        if self._turns.capacity:
            for i, (r, d) in enumerate(zip(rows, done, strict=True)):
                if d and not r.cancelled and r.cache_version == self._version:
                    cached = (r.prompt + r.tokens)[: r.n_cached]
                    self._turns.put(cached, kv_cache.row(batch.cache, i, r.n_cached, self._model.config),
                                    self._version)
        batch.keep([i for i, d in enumerate(done) if not d])

    def _sample_and_check(self, rows: list[_Request], logits: torch.Tensor) -> list[bool]:
        """Sample one token per row, record it, resolve finished rows; return per-row done flags."""
        temp = torch.tensor([r.params.temperature for r in rows])
        top_p = torch.tensor([r.params.top_p for r in rows])
        top_k = torch.tensor([r.params.top_k or 0 for r in rows], dtype=torch.int64)
        lp = processed_logprobs(logits, temp, top_p, top_k)
        gens = [r.generator or self._generator for r in rows]
        greedy = [r.params.temperature == 0 for r in rows]
        toks, lps = sample(lp, greedy, gens)
        tops = top_alternatives(lp, [r.params.top_logprobs for r in rows], toks, greedy)
        done = []
        for r, tok, logprob, top in zip(rows, toks, lps, tops, strict=True):
            r.tokens.append(tok)
            r.logprobs.append(logprob)
            if top is not None:
                r.top.append(top)
            _extend_spans(r.spans, self._version, r.cache_version)
            finish = None
            if r.cancelled:
                finish = "cancelled"
            elif tok in r.params.stop_token_ids:
                finish = "stop"
            elif (
                len(r.tokens) >= r.params.max_new_tokens or len(r.prompt) + len(r.tokens) >= self._max_context
            ):
                finish = "length"
            if finish is not None and finish != "cancelled":
                full = finish == "length" and len(r.prompt) + len(r.tokens) >= self._max_context
                out = GenerationOutput(list(r.tokens), list(r.logprobs), list(r.spans), finish, full,
                                       list(r.top) if r.params.top_logprobs else None)
                _resolve(r.loop, r.future, result=out)
            done.append(finish is not None)
        return done

    def _apply_update(self, upd: _Update, batch: _Batch) -> None:
        try:
            if upd.version <= self._version:
                raise WeightUpdateError(
                    f"new version {upd.version} must exceed the serving version {self._version}"
                )
            copy_into(self._model, upd.state)
        except Exception as exc:
            err = (
                exc
                if isinstance(exc, WeightUpdateError)
                else WeightUpdateError(f"weight copy failed: {exc!r}")
            )
            _resolve(upd.loop, upd.future, error=err)
            return
        finally:
            upd.state = {}  # the decode loop holds upd until its next command: let the sent copy go now
        self._serve(upd.version, batch)
        _resolve(upd.loop, upd.future, result=None)

    def _serve(self, version: int, batch: _Batch) -> None:
        """The parameters now hold ``version``: caches of older versions go; RECOMPUTE prefills the rows again."""
        self._version = version
        self._turns.clear()
        if self._continuation is ContinuationMode.RECOMPUTE and batch.rows:
            rows = list(batch.rows)
            batch.reset()
            caches = []
            try:
                for r in rows:  # the last sampled token is fed by the next decode step, as usual
                    caches.append(self._prefill(r, r.prompt + r.tokens[:-1])[0])
            except Exception as exc:
                error = EngineError(f"re-prefill after the weight update failed: {exc!r}")
                for r in rows:
                    _resolve(r.loop, r.future, error=error)
                caches, rows = [], []
            if rows:
                batch.add(rows, caches)


def _extend_spans(spans: list[TokenSpan], version: int, prefix_version: int) -> None:
    if spans and spans[-1].version == version and spans[-1].prefix_version == prefix_version:
        last = spans[-1]
        spans[-1] = TokenSpan(last.num_tokens + 1, version, prefix_version)
    else:
        spans.append(TokenSpan(1, version, prefix_version))


class _Batch:
    """The active rows and their left-padded KV cache of ``length`` positions."""

    def __init__(self) -> None:
        self.rows: list[_Request] = []
        self.cache: DynamicCache | None = None
        self.length = 0

    def reset(self) -> None:
        self.rows, self.cache, self.length = [], None, 0

    def add(self, rows: list[_Request], caches: list[DynamicCache]) -> None:
        lengths = [r.n_cached for r in rows]
        if self.cache is not None:
            caches, lengths = [self.cache, *caches], [self.length, *lengths]
        self.cache = kv_cache.merge(caches, lengths)
        self.length = max(lengths)
        self.rows = self.rows + rows

    def keep(self, indices: list[int]) -> None:
        if len(indices) == len(self.rows):
            return
        if not indices:
            self.reset()
            return
        self.rows = [self.rows[i] for i in indices]
        trim = self.length - max(r.n_cached for r in self.rows)
        kv_cache.select_rows(self.cache, indices, trim)
        self.length -= trim
