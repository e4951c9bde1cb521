"""Trainer backend `verl`: `verl.trainer.main_ppo` on a GPU cluster, with its checkpoints committed to the store.

`backend.VerlTrainer` plans the run offline (`overrides` maps the run config to main_ppo's Hydra overrides,
`validation` checks them against the installed verl). On the cluster, three moments, all configured by the
non-secret env vars of `settings.checkpoint_env`:

1. **Before main_ppo** (`python -m verl_grpo.trainers.verl.restore`, every node): the store's latest complete
   checkpoint into `trainer.default_local_dir`, plus verl's resume tracker.
2. **During training**: `callback.StoreCheckpointCallback` (verl's `trainer.checkpoint_callback_class`) commits
   each saved `global_step_N` to the store in the background (`commit`).
3. **After main_ppo** (`python -m verl_grpo.trainers.verl.finalize`, head node): the final step committed, the
   actor merged to an HF model (`merge`), model, metrics and `train_result.json` published.

Importing the package imports nothing heavy; verl is imported lazily where it is needed.
"""
