"""ALFWorld household text games (Shridhar et al., ICLR 2021) as an agentenv environment."""

from agentenv.envs.alfworld.commands import parse_command
from agentenv.envs.alfworld.env import AlfWorldEnv
from agentenv.envs.alfworld.games import SPLITS, TASK_TYPES, GameRef, list_games, read_game

__all__ = ["AlfWorldEnv", "GameRef", "SPLITS", "TASK_TYPES", "list_games", "parse_command", "read_game"]
