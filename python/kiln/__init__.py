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

from kiln._kiln import DeviceError, Error, InputError, ModelError, UnsupportedError
from kiln._model import CompiledModel, KilnWarning, Port, devices, load
from kiln._torch import CompiledModule, compile
from kiln._trainer import Trainer

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
