"""Trainer backend `trl`: TRL's GRPOTrainer in a worker process on this machine (CPU, or one GPU).

Importing the package imports nothing heavy; transformers and TRL load in the worker process only.
"""
