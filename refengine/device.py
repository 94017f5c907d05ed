"""Where tensors live: CUDA when present, otherwise process memory standing in for the GPU.

Pinned host memory exists only with an accelerator (``pin_memory()`` raises without one), so
every pin goes through :func:`host_buffer`.
"""

from __future__ import annotations


def compute_device():
    """The device of the "GPU" tier: ``cuda`` if available, else ``cpu``."""
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def torch_dtype(name: str):
    import torch

    return {"float32": torch.float32, "float64": torch.float64}[name]


def host_buffer(shape: tuple[int, ...], dtype, *, pinned: bool = True):
    """A zeroed host tensor, pinned when an accelerator exists and ``pinned`` is asked for."""
    import torch

    pin = pinned and torch.accelerator.is_available()
    return torch.zeros(shape, dtype=dtype, pin_memory=pin)


def synchronize(device) -> None:
    """Wait for queued copies on ``device`` so a measured time covers the whole transfer."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)
