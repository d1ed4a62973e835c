"""Agents as code: an OpenAI-API agent program plus a reward function as a trainable environment.

:class:`AgentEnv` (the environment), :class:`AgentEndpoint` (the OpenAI-compatible endpoint served
during rollout, backed by the generation engine), :class:`AgentContext` (what an agent callable gets).
Guide: ``docs/agents.md``.
"""

from agentenv.agents.endpoint import DEFAULT_MODEL, AgentEndpoint
from agentenv.agents.env import AgentContext, AgentEnv
from agentenv.agents.session import AgentSession, OpenAIError

__all__ = ["DEFAULT_MODEL", "AgentContext", "AgentEndpoint", "AgentEnv", "AgentSession", "OpenAIError"]
