"""Generation engines: the shared contract (``base``), ``TransformersEngine`` and ``VLLMEngine``.

Import the engine modules directly (``agentenv.engines.transformers_engine``,
``agentenv.engines.vllm_engine``): this package imports nothing heavy on its own.
"""
