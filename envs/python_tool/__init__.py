r"""Math problems solved with a sandboxed Python tool; reward 1 for a correct ``\\boxed{}`` answer."""

from agentenv.envs.python_tool.env import PythonToolEnv
from agentenv.envs.python_tool.tool import PYTHON_TOOL_SCHEMA, SYSTEM_PROMPT, format_result

__all__ = ["PYTHON_TOOL_SCHEMA", "SYSTEM_PROMPT", "PythonToolEnv", "format_result"]
