"""Remote environments over HTTP: ``agentenv serve`` (server) and :class:`RemoteEnv` (client).

:mod:`~agentenv.remote.protocol` the routes, bodies and error kinds; :mod:`~agentenv.remote.sessions`
the server's episodes; :mod:`~agentenv.remote.server` the Starlette app and the command;
:mod:`~agentenv.remote.client` the asynchronous environment on ``httpx``. Importing this package
loads neither Starlette nor uvicorn.
"""

from agentenv.remote.client import RemoteEnv

__all__ = ["RemoteEnv"]
