"""Experiments on the trainer, beside the training loop.

The papers' claims rerun (``agentenv study``), sync against async (``agentenv compare``), the pipeline
simulator (``agentenv simulate``), seeds aggregated (``learning_report``) and the statistics they share
(``significance``).
"""
