"""Trainer backend `loop`: the asynchronous rollout → reward → replay → update loop on this machine, as separate
processes (rollout servers behind a router, data-server, reward-server, replay buffer) around a plain-torch
GRPO update; the small-scale counterpart of verl's fully-async trainer."""
