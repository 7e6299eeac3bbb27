"""kiln.load and the compiled model it returns."""

from __future__ import annotations

import json
import os
import re
import warnings
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from kiln import _kiln
from kiln._kiln import InputError

PathLike = Union[str, "os.PathLike[str]"]


class KilnWarning(UserWarning):
    """A notice from Kiln: the kernel cache, an interpreter fallback, a conversion."""


class Port(NamedTuple):
    """One input or output of a model.

    ``shape`` holds an int for each static dim and, for a dynamic one, its
    symbol (``"batch"``) or None when it has no name.
    """

    name: str
    dtype: str
    shape: Tuple[Union[int, str, None], ...]
    optional: bool = False


def default_cache_dir() -> str:
    """The kernel cache folder ``kiln`` uses: $KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln or ~/.cache/kiln."""
    if os.environ.get("KILN_CACHE_DIR"):
        return os.environ["KILN_CACHE_DIR"]
    if os.environ.get("XDG_CACHE_HOME"):
        return os.path.join(os.environ["XDG_CACHE_HOME"], "kiln")
    home = os.environ.get("HOME")
    return os.path.join(home, ".cache", "kiln") if home else ""


# Kiln's library phrases some errors with `kiln`'s command-line flags; the
# Python API names its own parameters instead.
_FLAG_SPELLINGS = [
    (re.compile(r"--check-numerics"), "check_numerics=True"),
    (re.compile(r"--loss (\w+)"), r"loss='\1'"),
    (re.compile(r"--classes-last"), "classes_last=True"),
    (re.compile(r"--ignore-index"), "ignore_index"),
    (re.compile(r"--batch-size (\d+)"), r"batch_size=\1"),
    (re.compile(r"--drop-last"), "drop_last=True"),
    (re.compile(r"--device (\w+(?::\w+)?)"), r"device='\1'"),
    (re.compile(r"--zero-inputs( NAME,\.\.\.)?"), "zero inputs (`kiln train --zero-inputs`; kiln.Trainer feeds one input)"),
    (re.compile(r"--cache-dir DIR"), "cache_dir=DIR"),
    (re.compile(r"--no-cache"), 'cache_dir=""'),
]


def python_message(text: str) -> str:
    """``text`` with the command-line flags it names spelled as the Python API's parameters."""
    for pattern, spelling in _FLAG_SPELLINGS:
        text = pattern.sub(spelling, text)
    return text


class python_errors:
    """Re-raises a kiln.Error (or ValueError) whose message names command-line flags with the Python parameters'
    names: the same class, the message respelled."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, trace: Any) -> bool:
        if error is None or not isinstance(error, (_kiln.Error, ValueError)) or not error.args:
            return False
        text = str(error.args[0])
        spelled = python_message(text)
        if spelled == text:
            return False
        raise type(error)(spelled) from None


def check_device(device: str) -> str:
    """Raises kiln.DeviceError (ValueError for a malformed name) unless ``device`` is usable; returns the choice."""
    with python_errors():
        return _kiln.check_device(device)


def _is_torch_tensor(value: Any) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "detach") and hasattr(value, "numpy")


def _to_numpy(value: Any, name: str, model_device: str) -> Tuple[np.ndarray, Optional[Any]]:
    """``value`` as a NumPy array, and the torch device it came from (None for NumPy)."""
    if _is_torch_tensor(value):
        device = value.device
        tensor = value.detach()
        if device.type != "cpu":
            if not model_device.startswith("cuda"):
                raise InputError(
                    f"input '{name}' is a tensor on {device}, and the model runs on the CPU; "
                    "move it with .cpu(), or load the model with device=\"cuda\""
                )
            tensor = tensor.cpu()
        try:
            return tensor.numpy(), device
        except TypeError as e:  # bfloat16 and other dtypes NumPy lacks
            raise InputError(f"input '{name}' is a {tensor.dtype} tensor, which Kiln does not take here: {e}") from e
    if isinstance(value, np.ndarray):
        return value, None
    if isinstance(value, (int, float, bool, list, tuple, np.generic)):
        return np.asarray(value), None
    raise InputError(f"input '{name}' is a {type(value).__name__}; expected a NumPy array or a torch tensor")


class CompiledModel:
    """A model compiled by Kiln. Call it with NumPy arrays or torch tensors.

    Inputs go positionally, in the order of :attr:`inputs`, or by name;
    inputs with a default may be left out. The model is compiled for the
    shapes of the inputs it meets, once per set of shapes. The result is one
    array (or tensor) for a model with one output, else a tuple in the order
    of :attr:`outputs`; torch inputs give torch outputs, on the inputs'
    device. Outputs are not copied, and no later call reuses their memory.

    Calls release the GIL; concurrent calls on one model run one at a time.
    """

    def __init__(self, handle: "_kiln.Model") -> None:
        self._handle = handle
        self._inputs = [Port(*p) for p in handle.inputs]
        self._outputs = [Port(*p) for p in handle.outputs]

    @property
    def inputs(self) -> List[Port]:
        """The model's inputs: name, dtype, shape (symbolic dims as names), optional."""
        return list(self._inputs)

    @property
    def outputs(self) -> List[Port]:
        """The model's outputs: name, dtype, shape."""
        return list(self._outputs)

    @property
    def device(self) -> str:
        """Where the model runs: "cpu" or "cuda:N (NAME)"."""
        return self._handle.device

    def _describe_inputs(self) -> str:
        return ", ".join(f"{p.name} ({p.dtype}{list(p.shape)}{', optional' if p.optional else ''})" for p in self._inputs) or "none"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        names = [p.name for p in self._inputs]
        if len(args) > len(names):
            raise InputError(
                f"{len(args)} inputs given positionally, but the model takes {len(names)}: {self._describe_inputs()}"
            )
        given: List[Any] = [None] * len(names)
        for i, value in enumerate(args):
            given[i] = value
        for key, value in kwargs.items():
            if key not in names:
                raise InputError(f"unknown input '{key}'; the model's inputs are: {self._describe_inputs()}")
            i = names.index(key)
            if given[i] is not None:
                raise InputError(f"input '{key}' is given twice, positionally and by name")
            given[i] = value
        arrays: List[Optional[np.ndarray]] = []
        torch_device = None
        for name, value in zip(names, given):
            if value is None:
                arrays.append(None)
                continue
            array, device = _to_numpy(value, name, self.device)
            if device is not None and torch_device is None:
                torch_device = device
            arrays.append(array)
        with python_errors():
            outputs, notices = self._handle.run(arrays)
        for notice in notices:
            warnings.warn(notice, KilnWarning, stacklevel=2)
        if torch_device is not None:
            import torch

            outputs = [torch.from_numpy(o) for o in outputs]
            if torch_device.type != "cpu":
                outputs = [o.to(torch_device) for o in outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def save(self, path: PathLike) -> None:
        """Writes the program compiled for the last call's input shapes to ``path`` (a ``.kc`` file).

        ``kiln run path`` and :func:`load` run it without compiling again.
        Before any call, the inputs' static shapes are used (a model with
        dynamic dims must be called once first). A model on CUDA saves its
        CUDA program (CUBINs and PTX), which ``kiln run path`` runs on CUDA.
        """
        self._handle.save(os.fspath(path))

    def __repr__(self) -> str:
        return f"<kiln.CompiledModel on {self.device}: inputs {self._describe_inputs()}>"


def load(
    path: PathLike,
    device: str = "cpu",
    *,
    threads: int = 0,
    interpret: bool = False,
    allow_fallback: bool = True,
    cache_dir: Optional[str] = None,
    precision: str = "fp32",
) -> CompiledModel:
    """Loads and compiles the model at ``path``.

    ``path``: ``.onnx``, ``.kiln``, ``.kiln.txt``, ``.kir``, or a ``.kc`` file
    written by ``kiln compile`` or :meth:`CompiledModel.save`.

    ``device``: ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"auto"``. ``"cuda"``
    never falls back to the CPU: without a usable GPU it raises
    :class:`DeviceError` naming the reason. A ``.kc`` runs on the device it
    was compiled for: one compiled for CUDA needs ``"cuda"`` (or ``"auto"``)
    and runs on the first usable GPU.

    ``threads``: threads per kernel on the CPU (0: all cores).
    ``interpret``: run on Kiln's reference interpreter instead of the JIT.
    ``allow_fallback``: a model with ops the JIT cannot compile yet runs on
    the interpreter with a :class:`KilnWarning` naming them; False raises
    instead. ``cache_dir``: the compiled-kernel cache ("" for none).
    ``precision``: ``"fp32"``, ``"tf32"``, ``"bf16"`` or ``"fp16"``, as
    ``kiln run --precision`` (docs/precision.md): bf16 and fp16 give matmuls
    and convolutions low-precision inputs with f32 accumulation.
    """
    cache = default_cache_dir() if cache_dir is None else cache_dir
    with python_errors():
        handle = _kiln.Model(
            os.fspath(path), device, int(threads), cache, bool(allow_fallback), bool(interpret), str(precision)
        )
    return CompiledModel(handle)


def devices() -> Dict[str, Any]:
    """What ``kiln devices --json`` says: the CUDA driver, each device, the libraries, and a verdict.

    ``devices()["cuda_available"]`` answers as ``torch.cuda.is_available()``
    would, and ``devices()["verdict"]`` says why.
    """
    return json.loads(_kiln.devices_json())
