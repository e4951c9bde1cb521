"""What the GPU nodes' setup installs, and what that needs from the node: the torch and transformers that verl's
engine extra pins, the NVIDIA driver that torch's CUDA build needs, and SkyPilot's own uv. Pure: no `sky` import.

The pins are verl 0.9.1's own (`verl[vllm]` / `verl[sglang]` in its METADATA: `torch==2.11.0`,
`transformers==5.9.0`); tests/unit/test_node_stack.py reads them back from the installed verl. A uv resolve of
`verl[vllm]==0.9.1` for linux x86_64 picks PyPI's torch 2.11.0 wheel, which requires `cuda-toolkit==13.0.2` and the
`nvidia-*-cu13` libraries: CUDA 13.0, which needs an R580 driver (NVIDIA: CUDA 13.0 GA needs >= 580.65.06; R570 and
R535 support CUDA 12.x only). vLLM 0.24.0 alone would resolve transformers 5.24.0 (`transformers>=5.5.3`), which
verl's pin refuses, so the eval node pins the trainer's.
"""

from __future__ import annotations

import re

VERL_VERSION = "0.9.1"
TORCH_VERSION = "2.11.0"
"""The torch `verl[vllm]==0.9.1` and `verl[sglang]==0.9.1` pin (and vLLM 0.24.0 pins)."""
TORCH_CUDA = "13.0"
"""The CUDA that PyPI's torch 2.11.0 linux wheel is built for (cuda-toolkit==13.0.2, nvidia-*-cu13)."""
MIN_DRIVER = "580.65.06"
"""The lowest NVIDIA Linux driver CUDA 13.0 runs on (R580)."""
TRANSFORMERS_VERSION = "5.9.0"
"""The transformers `verl[vllm]==0.9.1` pins: the trainer's, and so the eval node's."""
SKY_UV_DIR = "$HOME/.local/bin"
"""Where SkyPilot installs its own uv on every node it provisions (sky/skylet/constants.py SKY_UV_INSTALL_DIR),
before any setup runs; a node's setup uses it instead of installing another with pip."""
TRANSFORMERS_PIN = f"transformers=={TRANSFORMERS_VERSION}"


def driver_check() -> list[str]:
    """Setup lines, before anything large downloads: the node's NVIDIA driver (nvidia-smi) is at least MIN_DRIVER
    (compared as versions, `sort -V`), else setup fails in one line naming both (a deterministic failure: exit 1,
    not restarted)."""
    need = (f"torch {TORCH_VERSION} (verl[vllm]=={VERL_VERSION}'s pin) is built for CUDA {TORCH_CUDA}, which needs "
            f"NVIDIA driver >= {MIN_DRIVER}")
    return [
        'DRIVER=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n1 || true)',
        f'if [ -z "$DRIVER" ] || [ "$(printf "%s\\n" {MIN_DRIVER} "$DRIVER" | sort -V | head -n1)" != {MIN_DRIVER} ]; '
        f'then echo "driver check: this node\'s NVIDIA driver is ${{DRIVER:-missing (nvidia-smi found none)}}, but '
        f'{need}: use a node image or node pool with an R{MIN_DRIVER.split(".")[0]}+ driver" >&2; exit 1; fi',
        f'echo "driver check: NVIDIA driver $DRIVER (>= {MIN_DRIVER} for torch {TORCH_VERSION}, CUDA {TORCH_CUDA})"',
    ]


def pinned(requirements: list[str] | tuple[str, ...], name: str) -> str | None:
    """The `==` version of `name` among pip requirement strings, else None."""
    for spec in requirements:
        found = re.fullmatch(rf"\s*{re.escape(name)}\s*==\s*([^\s;,]+)\s*", spec, re.IGNORECASE)
        if found:
            return found.group(1)
    return None
