"""Trainer backend `verl`: `verl.trainer.main_ppo` on a GPU cluster, with its checkpoints committed to the store.

Importing the package imports nothing heavy; verl is imported lazily where it is needed.
"""
