"""The policy's forward pass in training: log pi at the policy tokens, the shared prefix, checkpointing.

:func:`token_logprobs` is the one scoring function of every learner backend (training micro-steps
and :meth:`PolicyLearner.score <agentenv.trainer.learners.contract.PolicyLearner.score>` alike): the
vocabulary projection only at label positions, in token chunks
(:mod:`agentenv.trainer.learners.logprob_chunks`), under the engine's sampling transform, with the prefix all
rows share served from one KV cache (:mod:`agentenv.trainer.learners.shared_prefix`).
"""

from __future__ import annotations

import inspect

import torch

from agentenv.engines.sampling import SamplingTransform, label_logprobs
from agentenv.errors import ConfigError, DataError
from agentenv.trainer.batching import PolicyBatch, split_micro_batches
from agentenv.trainer.learners.logprob_chunks import DEFAULT_CHUNK_TOKENS, chunked_label_logprobs, split_head
from agentenv.trainer.learners.shared_prefix import SharedPrefix

__all__ = [
    "MIN_SHARED_PREFIX",
    "enable_gradient_checkpointing",
    "shared_prefix",
    "shared_prefix_length",
    "token_logprobs",
]


#: Shortest shared prefix (tokens) worth a separate forward pass.
MIN_SHARED_PREFIX = 16


def shared_prefix_length(batch: PolicyBatch) -> int:
    """Leading positions every row shares that hold no policy label: the part one KV cache can serve.

    The prefix is the longest run of positions ``0..n-1`` where all rows hold the same real token
    (the system prompt, the tool schemas; a GRPO group's whole prompt), capped so that every label
    position ``j >= n`` is computed in the suffix pass: ``n <= `` the first label position holding
    a policy token in any row (label ``j`` is predicted from position ``j``), and ``n <= L - 1``.

    Returns:
        ``n`` (tokens), 0 for a one-row batch.
    """
    ids, mask = batch.input_ids, batch.attention_mask
    b, length = ids.shape
    if b < 2 or length < 2:
        return 0
    same = (ids == ids[:1]).all(dim=0) & mask.bool().all(dim=0)
    differs = (~same).nonzero()
    n = int(differs[0]) if differs.numel() else length
    policy = batch.loss_mask.any(dim=0).nonzero()
    if policy.numel():
        n = min(n, int(policy[0]))
    return min(n, length - 1)


def token_logprobs(
    model: torch.nn.Module,
    batch: PolicyBatch,
    *,
    with_entropy: bool = False,
    sampling: SamplingTransform | None = None,
    share_prefix: bool = False,
    chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS,
    prefix: SharedPrefix | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Current log pi(label) at every policy-token label position, and optionally the entropy.

    pi is the policy *as the engine samples from it*: ``sampling`` (the rollout's temperature, top-k
    and top-p) is applied to the logits exactly as the engine did for the behaviour log mu
    (:func:`agentenv.engines.sampling.label_logprobs`), differentiable through the temperature and the
    renormalisation, so the gate and the ratio compare the same distribution. None (the identity:
    temperature 1, no truncation) is plain ``log_softmax``.

    The vocabulary projection runs only at label positions where some row holds a policy token
    (``k`` of the ``t`` positions; ``logits_to_keep`` for a model that takes it). For a transformers
    causal LM whose logits are ``lm_head(hidden)`` (:func:`agentenv.trainer.learners.logprob_chunks.split_head`)
    it runs ``chunk_tokens`` tokens at a time with the logits recomputed in the backward pass
    (:func:`agentenv.trainer.learners.logprob_chunks.chunked_label_logprobs`): no ``(b, k, V)`` float32 tensor
    is ever alive, at most one ``(chunk_tokens, V)`` one.

    With ``share_prefix`` (see :attr:`OptimConfig.share_prefix`), the ``n`` leading tokens all rows
    share (:func:`shared_prefix_length`) run once as a ``(1, n)`` pass whose KV cache is repeated to
    the ``b`` rows, and the rows run only their ``(b, L - n)`` suffixes against it. ``prefix`` gives
    that KV cache ready-made (computed once for a whole batch of which ``batch`` is a subset of
    rows); the gradient then stops at its leaves until :meth:`SharedPrefix.backward`. Either way the
    values and the gradient are the plain pass's up to float rounding (``tests/trainer/test_learner.py``).

    Args:
        model: A causal LM returning ``.logits`` of shape ``(b, L, V)`` (or ``(b, k, V)`` when given
            ``logits_to_keep`` as a ``(k,)`` index tensor); a DeepSpeed engine wrapping one is fine
            (scored by its own forward pass, unchunked).
        batch: The (micro-)batch.
        with_entropy: Also return the entropy (nats) of the processed distribution (full vocabulary
            under the identity), computed without gradient.
        sampling: The behaviour transform; None is the identity.
        share_prefix: Serve the shared prefix from one KV cache when the model allows it.
        chunk_tokens: Tokens per vocabulary projection (> 0); None: one projection of all ``b * k``.
        prefix: The shared prefix's KV cache for ``batch``'s first ``prefix.length`` tokens (all
            before the first policy label), or None.

    Returns:
        ``(logprobs (b, t) float32 nats, entropy (b, t) float32 or None)``. Values at positions without
        a policy token are finite but meaningless (0 where the projection was skipped); the objectives
        mask them with ``loss_mask``.
    """
    b, t = batch.labels.shape
    keep = batch.loss_mask.any(dim=0).nonzero().squeeze(1)
    if prefix is None and share_prefix and keep.numel():
        prefix = shared_prefix(model, batch, leaves=False)
    parts = split_head(model) if chunk_tokens is not None else None
    if parts is not None:
        decoder, head = parts
        if prefix is not None:
            hidden = _suffix_forward(decoder, batch, prefix).last_hidden_state[:, keep - prefix.length]
        else:
            hidden = decoder(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                             use_cache=False).last_hidden_state[:, keep]
        lp, ent = chunked_label_logprobs(hidden, head, batch.labels[:, keep], sampling, chunk_tokens,
                                         with_entropy=with_entropy)
    else:
        if prefix is not None:
            logits = _suffix_forward(model, batch, prefix, logits_to_keep=keep - prefix.length).logits
        elif _accepts_logits_to_keep(model) and 0 < keep.numel() < t:
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, logits_to_keep=keep).logits
        else:
            keep = None
            logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
        labels = batch.labels if keep is None else batch.labels[:, keep]
        lp, ent = label_logprobs(logits.float(), labels, sampling, with_entropy=with_entropy)
    if keep is not None:
        lp = lp.new_zeros(b, t).index_copy(1, keep, lp)
        ent = None if ent is None else ent.new_zeros(b, t).index_copy(1, keep, ent)
    return lp, ent



def mean_policy_entropy(
    model: torch.nn.Module,
    batch: PolicyBatch,
    *,
    micro_batch_size: int,
    sampling: SamplingTransform | None = None,
    share_prefix: bool = False,
    chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS,
    device: torch.device | str | None = None,
) -> float:
    """The mean entropy of ``model``'s processed distribution at ``batch``'s policy tokens (nats/token).

    One no-grad pass of :func:`token_logprobs` per ``micro_batch_size`` rows (the model in eval mode,
    its mode restored after); the entropy of every policy position, summed, over their count.

    Raises:
        DataError: ``batch`` holds no policy token.
    """
    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for mb in split_micro_batches(batch, micro_batch_size):
                mb = mb.to(device) if device is not None else mb
                _, ent = token_logprobs(model, mb, with_entropy=True, sampling=sampling, share_prefix=share_prefix,
                                        chunk_tokens=chunk_tokens)
                total += float(ent[mb.loss_mask].double().sum())
                count += int(mb.loss_mask.sum())
    finally:
        model.train(was_training)
    if count == 0:
        raise DataError("no policy token to measure the entropy at")
    return total / count


def shared_prefix(model: torch.nn.Module, batch: PolicyBatch, *, leaves: bool) -> SharedPrefix | None:
    """The KV cache of ``batch``'s shared prefix (:func:`shared_prefix_length`), or None.

    None when the model cannot serve rows from a cache (:func:`_can_share_prefix`) or the prefix is
    shorter than :data:`MIN_SHARED_PREFIX` tokens (or the batch has one row). ``leaves``: see
    :class:`agentenv.trainer.learners.shared_prefix.SharedPrefix`.
    """
    if not _can_share_prefix(model):
        return None
    n = shared_prefix_length(batch)
    if n < MIN_SHARED_PREFIX:
        return None
    parts = split_head(model)
    runner = parts[0] if parts is not None else model
    return SharedPrefix(runner, model.config, batch.input_ids[0, :n], leaves=leaves)


def _suffix_forward(model: torch.nn.Module, batch: PolicyBatch, prefix: SharedPrefix, **kw: object) -> object:
    """``model``'s output on the rows' tokens after the prefix (positions ``n..L-1``), served from its cache."""
    from agentenv.engines.kv_cache import cache_keyword

    b, length = batch.input_ids.shape
    n = prefix.length
    positions = torch.arange(n, length, device=batch.input_ids.device).expand(b, -1)
    return model(
        input_ids=batch.input_ids[:, n:], attention_mask=batch.attention_mask, position_ids=positions,
        use_cache=True, **{cache_keyword(model): prefix.cache(b)}, **kw,
    )


def _can_share_prefix(model: torch.nn.Module) -> bool:
    """A transformers causal LM itself (not a wrapper) that keeps a KV cache in this mode."""
    try:
        from transformers import PreTrainedModel
    except ImportError:  # pragma: no cover - transformers is a core dependency
        return False
    if not isinstance(model, PreTrainedModel) or not _accepts_logits_to_keep(model):
        return False
    flag = "is_activation_checkpointing"  # transformers >= 5.x; older releases name it is_gradient_...
    if not hasattr(model, flag):
        flag = "is_gradient_checkpointing"
    return not getattr(model, flag, False)


def enable_gradient_checkpointing(model: torch.nn.Module) -> None:
    """Turn on non-reentrant activation checkpointing for a transformers model (training mode only).

    Raises:
        ConfigError: The model has no ``gradient_checkpointing_enable`` (not a transformers model).
    """
    inner = getattr(model, "module", model)
    kwargs = {"use_reentrant": False}
    if hasattr(inner, "activation_checkpointing_enable"):  # transformers >= 5.x names it so
        inner.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(inner, "gradient_checkpointing_enable"):
        inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ConfigError(f"learner.gradient_checkpointing needs a transformers model, not {type(inner).__name__}")
    if getattr(inner, "config", None) is not None:
        inner.config.use_cache = False  # a KV cache is useless in a training forward pass


def _accepts_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether ``model`` (or the module a DeepSpeed engine wraps) takes a ``logits_to_keep`` argument."""
    inner = getattr(model, "module", model)
    try:
        return "logits_to_keep" in inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return False
