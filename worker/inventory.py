"""What GPUs this node has: pynvml where an NVIDIA driver exists, else simulated ones.

Never initialise CUDA (torch.cuda) in the worker's parent process: RQ forks a work-horse
per job, and CUDA does not survive a fork. pynvml talks to the driver without CUDA.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

log = logging.getLogger(__name__)
SIMULATED_MODEL = "Simulated GPU (trains on CPU)"
SIMULATED_MEMORY_MB = 16384


@dataclass
class GpuReading:
    index: int
    uuid: str
    model: str
    memory_mb: int
    memory_used_mb: int = 0
    utilization: int = 0
    simulated: bool = False


def nvml_gpus() -> list[GpuReading] | None:
    """Readings from NVML, or None when there is no NVIDIA driver."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, …
        log.info("no NVIDIA driver (%s)", exc)
        return None
    try:
        readings = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            name = pynvml.nvmlDeviceGetName(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                utilization = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            except Exception:  # noqa: BLE001 - not supported on some devices (MIG)
                utilization = 0
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            readings.append(GpuReading(
                index=index,
                uuid=uuid.decode() if isinstance(uuid, bytes) else uuid,
                model=name.decode() if isinstance(name, bytes) else name,
                memory_mb=memory.total // 2**20,
                memory_used_mb=memory.used // 2**20,
                utilization=int(utilization),
            ))
        return readings
    finally:
        pynvml.nvmlShutdown()


def simulated_gpus(count: int) -> list[GpuReading]:
    return [GpuReading(index=i, uuid=f"SIM-{i}", model=SIMULATED_MODEL, memory_mb=SIMULATED_MEMORY_MB,
                       simulated=True) for i in range(count)]


def detect(simulate: int | None) -> list[GpuReading]:
    """Real GPUs when present; ``simulate`` GPUs otherwise (or when forced with simulate > 0)."""
    if simulate:
        return simulated_gpus(simulate)
    real = nvml_gpus()
    if real:
        return real
    log.warning("no NVIDIA GPU found: registering 1 simulated GPU (training runs on CPU)")
    return simulated_gpus(1)


def host_memory_mb() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
    except (ValueError, OSError):
        return 0
