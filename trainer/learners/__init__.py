"""The learner: the contract every backend keeps, the shared update step, and the backends.

``contract`` (what the training loop asks of a learner), ``config`` (optimizer, objective,
execution), ``update_step`` (the batch, the micro-step and the statistics every backend shares),
``forward`` / ``logprob_chunks`` / ``shared_prefix`` (the policy's forward pass in training),
``single`` (one process, CPU or one GPU), ``openrlhf`` / ``deepspeed_strategy`` /
``openrlhf_compat`` (DeepSpeed through OpenRLHF), ``ray_group`` (the DeepSpeed learner as Ray
actors), ``cpu_data_parallel`` (their CPU test harness), ``lora`` (low-rank adapters) and
``backends`` (the learner of ``learner.backend``).
"""
