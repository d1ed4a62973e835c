"""Environments shipped with agentenv (installed as ``agentenv.envs``)."""
