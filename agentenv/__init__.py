"""agentenv: asynchronous multi-turn tool-using environments and an asynchronous RL trainer.

Importing this package loads no environment, model or sandbox; ``make`` imports what it builds.
"""

from agentenv.core import Demonstration, Env, StepResult, TaskSet, text_space
from agentenv.errors import AgentEnvError
from agentenv.registration import make, register, registry, spec

__all__ = ["AgentEnvError", "Demonstration", "Env", "StepResult", "TaskSet", "make", "register", "registry", "spec",
           "text_space"]
__version__ = "0.1.0"
