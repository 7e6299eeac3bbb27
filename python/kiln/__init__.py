"""Kiln from Python: compile and run PyTorch modules and model files, and train them.

Kiln is a graph compiler and JIT runtime for neural networks. This package
runs it in the Python process::

    import kiln, torch, torchvision
    model = torchvision.models.resnet18().eval()
    x = torch.randn(1, 3, 224, 224)
    compiled = kiln.compile(model, (x,))      # exported, compiled, run by Kiln
    y = compiled(x)                           # a torch tensor, as model(x) gives

- :func:`load` compiles a model file (``.onnx``, ``.kiln``, ``.kiln.txt``,
  ``.kir``, or a ``.kc`` from ``kiln compile``) into a :class:`CompiledModel`.
- :func:`compile` does the same for a ``torch.nn.Module``.
- :class:`Trainer` trains a module or a model file with Kiln's training step.
- :func:`devices` says whether CUDA is usable, as ``kiln devices --json``.

Errors are :class:`Error` and its subclasses, with the messages the ``kiln``
command prints. ``device="cuda"`` never falls back to the CPU. See
``docs/python.md``.
"""

import os as _os


def _choose_openmp_spin():
    """Kiln's choice of libgomp's spin (runtime/openmp/OpenMpWaitPolicy.cpp, which makes it in the `kiln`
    executable): libgomp, which oneDNN runs on, reads GOMP_SPINCOUNT once when it loads, below, unless the process
    loaded it before. When other programs' runnable tasks fill every core, idle OpenMP threads sleep after a short
    spin (1000) instead of 300000 (libgomp's default), which keeps Kiln fast while other programs keep the cores
    busy. A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is left as it is."""
    if "OMP_WAIT_POLICY" in _os.environ or "GOMP_SPINCOUNT" in _os.environ:
        return
    import time

    samples = []
    for i in range(3):
        try:
            with open("/proc/stat") as f:
                running = next((int(line.split()[1]) for line in f if line.startswith("procs_running ")), 0)
        except OSError:
            return
        samples.append(running - 1)
        if i < 2:
            time.sleep(0.002)
    others = sorted(samples)[1]
    cpus = len(_os.sched_getaffinity(0)) if hasattr(_os, "sched_getaffinity") else (_os.cpu_count() or 1)
    _os.environ["GOMP_SPINCOUNT"] = "1000" if others >= cpus else "300000"


_choose_openmp_spin()

from kiln._kiln import DeviceError, Error, InputError, ModelError, UnsupportedError  # noqa: E402
from kiln._model import CompiledModel, KilnWarning, Port, devices, load  # noqa: E402
from kiln._torch import CompiledModule, compile  # noqa: E402
from kiln._trainer import Trainer  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "CompiledModel",
    "CompiledModule",
    "DeviceError",
    "Error",
    "InputError",
    "KilnWarning",
    "ModelError",
    "Port",
    "Trainer",
    "UnsupportedError",
    "compile",
    "devices",
    "load",
]

from kiln import _torch as _torch_module

_torch_module.register_backend()
