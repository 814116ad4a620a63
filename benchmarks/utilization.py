"""The GPU's mean utilization while a block runs (NVML through torch), for the benchmarks that time a GPU
(gpu.py, fused.py). Needs torch only, so it runs where Ray, MLflow and Optuna are not."""

from __future__ import annotations

import threading

import torch


class Utilization:
    """Mean GPU utilization (%) sampled every `every` seconds while the block runs; None without NVML or
    a GPU."""

    def __init__(self, device: str | torch.device, every: float = 0.5):
        self.samples: list[float] = []
        self.every = every
        self.enabled = str(device).startswith("cuda")
        if self.enabled:
            try:
                torch.cuda.utilization()
            except Exception:  # noqa: BLE001 (no pynvml / NVML: said as n/a)
                self.enabled = False
        self.stop = threading.Event()

    def _sample(self) -> None:
        while not self.stop.wait(self.every):
            self.samples.append(float(torch.cuda.utilization()))

    def __enter__(self):
        if self.enabled:
            self.thread = threading.Thread(target=self._sample, daemon=True)
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.enabled:
            self.thread.join()

    @property
    def mean(self) -> float | None:
        return sum(self.samples) / len(self.samples) if self.samples else None
