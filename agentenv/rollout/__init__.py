"""The model side of a rollout: one episode, many at once, the pool they feed, and the chat they speak.

``episode`` (one episode as a :class:`~agentenv.trajectory.Trajectory`: the loop of generation and
``step``, its budgets and deadlines, the renderer protocols), ``collector`` (many concurrent
episodes, retries and the failure rule) with ``task_stream`` (the order tasks are played in),
``pool`` and ``staleness`` (the finished trajectories and the policy that selects a batch),
``forced_lag`` (an engine kept a fixed number of versions behind), ``chat`` (the chat template as
token ids), ``tool_calls`` and ``tool_formats`` (tool calls parsed from a reply in the model
family's format). The engines and agents as code are ``agentenv.engines`` and ``agentenv.agents``.
"""
