"""The asynchronous RL trainer (installed as ``agentenv.trainer``)."""
