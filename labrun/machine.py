"""What this machine offers against what an idea's `constraints.compute` asks for: a warning,
never a refusal (the agent may still run the CPU parts, or the idea may be run elsewhere)."""

from __future__ import annotations

from pathlib import Path

from labrun.idea import Idea

DEVICES = Path("/dev")


def gpu_count(devices: Path = DEVICES) -> int:
    """GPUs the kernel shows: NVIDIA's `/dev/nvidia<N>`, else 1 for AMD's ROCm (`/dev/kfd`)."""
    nvidia = [p for p in devices.glob("nvidia*") if p.name[len("nvidia"):].isdigit()]
    return len(nvidia) or int((devices / "kfd").exists())


def compute_warnings(idea: Idea, devices: Path = DEVICES) -> list[str]:
    """One line when the idea asks for GPUs this machine does not have."""
    asked = idea.constraints.compute
    needed = {"gpu_required": 1, "multi_gpu": 2}.get(asked or "")
    have = gpu_count(devices) if needed else 0
    if needed is None or have >= needed:
        return []
    return [f"constraints.compute: {asked}, but this machine has {have or 'no'} GPU{'' if have == 1 else 's'}; "
            "the experiments will run on what is here"]
