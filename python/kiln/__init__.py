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

# Kiln's default OpenMP wait policy (runtime/openmp/OpenMpWaitPolicy.cpp, which sets the same in the `kiln`
# executable): libgomp, which oneDNN runs on, reads it once when it loads, below, unless the process loaded it
# before. Idle OpenMP threads then sleep after a short spin instead of 15 ms, which keeps Kiln fast while other
# programs keep every core busy. A user's OMP_WAIT_POLICY or GOMP_SPINCOUNT is left as it is.
if "OMP_WAIT_POLICY" not in _os.environ and "GOMP_SPINCOUNT" not in _os.environ:
    _os.environ["GOMP_SPINCOUNT"] = "1000"

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
