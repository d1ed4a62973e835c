"""One exception hierarchy for agentenv.

Every error agentenv raises on purpose derives from :class:`AgentEnvError`, so a caller can catch the
whole family with one clause and tell our errors from bugs. Errors that are also a standard kind of
error (a bad value, a missing key) inherit from the matching built-in too.
"""

from __future__ import annotations


class AgentEnvError(Exception):
    """Base class of every error agentenv raises on purpose."""


class ConfigError(AgentEnvError, ValueError):
    """A configuration value has the wrong type, is out of range, or contradicts another value."""


class RegistrationError(AgentEnvError):
    """An environment id is registered twice, or its entry point cannot be loaded."""


class EnvNotFound(RegistrationError, KeyError):
    """``make(id)`` was called with an id that is not registered (the message lists the known ids)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else ""


class EnvUnavailable(AgentEnvError):
    """A known environment cannot be built on this machine; the message names what it needs and how to get it.

    Raised when the environment is made, before the peer's code runs: data the game downloads on first
    use is not installed (an NLTK corpus), the key of an online service it calls is not set, or its
    code does not compile on this Python. Nothing is downloaded to find out.
    """


class ResetNeeded(AgentEnvError):
    """``step`` was called before ``reset`` or after the episode ended."""


class ClosedError(AgentEnvError):
    """An environment, sandbox or engine was used after ``close()``."""


class SandboxError(AgentEnvError):
    """A sandbox backend cannot be started or is not available on this machine."""


class EngineError(AgentEnvError):
    """A generation engine failed (died mid-generation, or was asked for something it cannot do)."""


class WeightUpdateError(EngineError):
    """New weights could not be loaded; the engine keeps serving its previous policy version."""


class EngineDied(EngineError):
    """The engine itself failed with requests in flight (its decode thread or process died, a forward pass raised).

    Not the request's fault: :class:`agentenv.engines.supervised.SupervisedEngine` rebuilds the engine.
    """


class EngineRebuilt(EngineError):
    """The engine serving this request died and was rebuilt; the episode's task is requeued, not failed.

    Attributes:
        requeue: Always True: the collector replays the task without counting a failed attempt.
    """

    requeue = True


class GradingError(AgentEnvError):
    """An answer could not be graded for reasons outside the policy (the grading worker hung or died).

    The episode fails (status ``"error"``) and its task is replayed; it never enters a batch as reward 0.
    """


class TemplateError(AgentEnvError):
    """A chat template broke the token-in-token-out prefix property and the turn cannot be appended."""


class DataError(AgentEnvError, ValueError):
    """A data set, game file or trajectory is missing, malformed, or holds invalid values."""


class CheckpointError(AgentEnvError):
    """A checkpoint cannot be written or read (truncated, corrupt, or from another run)."""


class RunFolderError(AgentEnvError):
    """A run folder already holds a run and ``--overwrite`` was not given."""


class EnvCheckError(AgentEnvError, AssertionError):
    """``agentenv.checker.check_env`` found an environment breaking the Env contract (the message says how)."""


class Interrupted(AgentEnvError):
    """The user stopped a job (Ctrl-C) at a point where nothing could be kept (e.g. mid warm-up)."""


class RemoteEnvError(AgentEnvError):
    """A remote environment (``agentenv serve``) failed a call: an infrastructure failure, not the policy's.

    Raised by :class:`agentenv.remote.RemoteEnv` when the server cannot be reached, dies, stalls past
    the timeout, answers something that is not the protocol, or answers a typed error. Like any
    exception from an environment it ends only its own episode, which the collector counts as failed
    (never as reward 0) and replays.

    Attributes:
        kind: The error kind: one of :data:`agentenv.remote.protocol.ERROR_STATUS`'s keys when the
            server answered one, else ``"unreachable"``, ``"timeout"`` or ``"protocol"``.
        status: The HTTP status of the answer, or None when there was none.
    """

    def __init__(self, message: str, *, kind: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
