"""A local rehearsal of SkyPilot ("the cloud") that runs the very task YAML our SkyPilot provider renders.

`sky_boundary` is a drop-in for `verl_grpo.providers.skypilot.boundary`: a managed job becomes a detached
`controller` process that parses the YAML with SkyPilot's own loaders and runs every node of every task in its
own unprivileged Linux namespaces (PID + mount: a private /tmp and /etc/hosts) on this machine. Setup, run,
ray, file_mounts from the store and the workdir sync run for real; GPUs, package installs (checked offline by
shims) and verl's GPU trainer (`main_ppo_cpu`) are stood in for. Preemptions are injected by step number.
"""

ENV_DIR = "VERL_GRPO_REHEARSAL_DIR"
"""Where all rehearsal state lives (jobs, clusters); required by `sky_boundary`."""
BOUNDARY_MODULE = "verl_grpo_rehearsal.sky_boundary"
"""What the SkyPilot provider is told to use in SkyPilot's place (its `ENV_BOUNDARY`)."""
ENV_PREEMPT_AT = "VERL_GRPO_REHEARSAL_PREEMPT_AT"
"""Comma list of verl step numbers at which the primary task's nodes are killed (read when a job is launched)."""
ENV_PREEMPT_PENDING = "VERL_GRPO_REHEARSAL_PREEMPT_PENDING"
"""Set on the primary task's nodes at each launch: the injected preemptions still to come (comma list of steps).
The CPU stand-in holds after such a step until it is killed, as a GPU step lasting minutes would: its own steps
take a fraction of a second, so without the hold step N+1 (and an injected failure there) could finish before
the controller has read step N's commit line, and the rehearsal would depend on the machine's load."""
PREEMPT_HOLD_S = 30.0
"""Longest the stand-in holds after a preemption step (the controller fires at most 25 s after the step's line: a
multi-node commit waits for the nodes' checkpoint syncs to upload)."""
ENV_FAIL_AT = "VERL_GRPO_REHEARSAL_FAIL_AT"
"""Passed through to the nodes: the CPU trainer stand-in fails by itself at this step."""
ENV_DRIVER = "VERL_GRPO_REHEARSAL_DRIVER"
"""The NVIDIA driver version the rehearsal's nodes report (`nvidia-smi`'s stand-in, see `shims`); read when a job is
launched, like ENV_FAIL_AT, and passed to its nodes."""
DEFAULT_DRIVER = "580.95.05"
"""The driver version a rehearsal node reports when ENV_DRIVER is unset."""
ENV_ON_NODE = "VERL_GRPO_REHEARSAL"
"""Set to "1" in every node process."""
ENV_MAIN_PPO = "VERL_GRPO_REHEARSAL_MAIN_PPO"
"""Module run in place of `verl.trainer.main_ppo` (default `verl_grpo_rehearsal.main_ppo_cpu`)."""
DEFAULT_MAIN_PPO = "verl_grpo_rehearsal.main_ppo_cpu"
STANDIN_THREADS = 1
"""torch threads of the CPU stand-ins (trainer and vLLM's eval) on a node: they run a toy model in place of the GPUs,
whose matmuls gain nothing from a second thread, and every node of a rehearsal shares this machine's cores, where two
threads each waiting on the other's core run several times slower than one (bench/trl_step_bench.py's notes)."""


def launch_env(state_dir: str) -> dict[str, str]:
    """The environment a process needs to launch, list or cancel jobs on the rehearsal whose state is `state_dir`."""
    from verl_grpo.providers.skypilot.provider import ENV_BOUNDARY

    return {ENV_DIR: state_dir, ENV_BOUNDARY: BOUNDARY_MODULE}


def uses_agent_loop(config) -> bool:
    """Whether verl would roll this run (its composed config) out in multi-turn agent loops, the tool loop: then the
    stand-ins import verl's agent loop (`standin_agent_loop`), which a run without tools does not pay for."""
    return bool(config.actor_rollout_ref.rollout.get("multi_turn", {}).get("enable", False))
