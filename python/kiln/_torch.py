"""kiln.compile: a torch.nn.Module exported in memory and compiled by Kiln; the torch.compile backend."""

from __future__ import annotations

import inspect
import os
import shutil
import tempfile
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from kiln import _kiln
from kiln._fastpath import replace_fast_path_ops
from kiln._model import CompiledModel, load

OPSET = 17


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - PyTorch is a dependency of this function only
        raise _kiln.Error("kiln.compile needs PyTorch (import torch failed: " + str(e) + ")") from e
    return torch


def _forward_names(module: Any, count: int) -> List[str]:
    """Names for the exported inputs: forward's parameter names, so that the compiled model takes them by name."""
    try:
        params = [
            p.name
            for p in inspect.signature(module.forward).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):
        params = []
    names = params[:count]
    names += [f"input_{i}" for i in range(len(names), count)]
    return names


def _as_tensor(torch: Any, value: Any, index: int) -> Any:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value)
    raise TypeError(f"example_inputs[{index}] is a {type(value).__name__}; expected a torch tensor or a NumPy array")


def _flatten_outputs(torch: Any, out: Any) -> Tuple[int, Optional[type]]:
    """How many tensors the module returns, and the container type (None for one tensor)."""
    if isinstance(out, torch.Tensor):
        return 1, None
    if isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
        return len(out), type(out)
    raise _kiln.UnsupportedError(
        f"the module returns a {type(out).__name__}; kiln.compile takes modules that return a tensor "
        "or a tuple or list of tensors"
    )


def _torchscript_exporter(torch: Any) -> Dict[str, Any]:
    """The argument that chooses the TorchScript-based exporter where ``torch.onnx.export`` has a choice.

    From PyTorch 2.9 the default is the ``torch.export``-based exporter,
    which needs ``onnxscript`` and gives other graphs (other names, ops and
    dynamic-shape handling) than the TorchScript exporter that Kiln's
    importer and this module are written and tested for (PyTorch 1.13 has
    only that one, without the argument).
    """
    try:
        parameters = inspect.signature(torch.onnx.export).parameters
    except (TypeError, ValueError):  # pragma: no cover - a builtin without a signature
        return {}
    return {"dynamo": False} if "dynamo" in parameters else {}


def export_onnx(
    module: Any,
    example: Tuple[Any, ...],
    path: str,
    input_names: Sequence[str],
    output_names: Sequence[str],
    dynamic_batch: bool,
    training: Any,
    constant_folding: bool,
) -> None:
    """torch.onnx.export with Kiln's settings; its failures become kiln.UnsupportedError."""
    torch = _torch()
    axes = {}
    if dynamic_batch:
        for name, x in zip(input_names, example):
            if x.dim() > 0:
                axes[name] = {0: "batch"}
        for name in output_names:
            axes[name] = {0: "batch"}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                module,
                tuple(example),
                path,
                input_names=list(input_names),
                output_names=list(output_names),
                dynamic_axes=axes or None,
                opset_version=OPSET,
                do_constant_folding=constant_folding,
                training=training,
                **_torchscript_exporter(torch),
            )
    except Exception as e:  # noqa: BLE001 - any failure of the exporter
        raise _kiln.UnsupportedError(
            f"PyTorch's ONNX exporter could not export the module, so Kiln cannot compile it: {type(e).__name__}: {e}"
        ) from e


class CompiledModule:
    """A torch.nn.Module compiled by Kiln (:func:`compile`): call it as the module.

    It runs the whole graph in Kiln, never in PyTorch: the module is not
    called again, so changing it (its ``forward``, its weights) after
    compiling changes nothing here. Torch tensors in give torch tensors out;
    NumPy arrays give NumPy arrays.
    """

    def __init__(self, model: CompiledModel, container: Optional[type], workdir: str) -> None:
        self.model = model
        self._container = container
        self._workdir = workdir

    @property
    def inputs(self):
        return self.model.inputs

    @property
    def outputs(self):
        return self.model.outputs

    @property
    def device(self) -> str:
        return self.model.device

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self.model(*args, **kwargs)
        if self._container is None:
            return out
        items = out if isinstance(out, tuple) else (out,)
        return self._container(items)

    def save(self, path) -> None:
        """Writes the compiled program (``.kc``) for the last call's shapes; see CompiledModel.save."""
        self.model.save(path)

    def __del__(self) -> None:
        shutil.rmtree(getattr(self, "_workdir", ""), ignore_errors=True)

    def __repr__(self) -> str:
        return f"<kiln.CompiledModule on {self.device}>"


def compile(
    module: Any,
    example_inputs: Any,
    device: str = "cpu",
    dynamic_batch: bool = True,
    *,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
    threads: int = 0,
    allow_fallback: bool = True,
    cache_dir: Optional[str] = None,
) -> CompiledModule:
    """Compiles a ``torch.nn.Module`` with Kiln.

    The module is exported to ONNX in memory (``torch.onnx.export``, opset
    17, in the mode the module is in: call ``module.eval()`` for inference)
    with ``example_inputs`` (a tensor or a tuple of tensors), then compiled
    for ``device`` like :func:`load`. With ``dynamic_batch`` the first dim of
    every input and output is dynamic, so other batch sizes compile on first
    use. Inputs are named after ``forward``'s parameters unless
    ``input_names`` says otherwise.

    Raises :class:`UnsupportedError` naming what Kiln cannot compile (every
    unsupported op, or the exporter's failure), and :class:`DeviceError` when
    ``device`` is not usable; never falls back to PyTorch or to the CPU.
    """
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"kiln.compile takes a torch.nn.Module, got a {type(module).__name__}")
    _kiln.check_device(device)
    if module.training:
        # The export keeps training-mode Dropout, which Kiln compiles with a
        # mask fixed by its seed: the same on every call, unlike PyTorch's.
        dropouts = [name or type(m).__name__ for name, m in module.named_modules()
                    if isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0]
        if dropouts:
            raise _kiln.UnsupportedError(
                f"Kiln cannot compile the module: Dropout {dropouts[0]!r} in training mode is random dropout, which "
                "Kiln would compile with the same mask on every call where PyTorch draws a new one"
                "\n(the module is in training mode: call module.eval() before kiln.compile to compile it for "
                "inference; kiln.Trainer trains it)")
    if isinstance(example_inputs, (torch.Tensor, np.ndarray)):
        example_inputs = (example_inputs,)
    example = tuple(_as_tensor(torch, x, i) for i, x in enumerate(example_inputs))
    names = list(input_names) if input_names else _forward_names(module, len(example))
    if len(names) != len(example):
        raise ValueError(f"{len(names)} input names for {len(example)} example inputs")
    # Running the module in training mode (here and in the exporter's trace)
    # updates its batch norms' running statistics: they are put back after.
    saved = {k: v.detach().clone() for k, v in module.state_dict().items()} if module.training else None
    try:
        with torch.no_grad():
            reference = module(*example)
        count, container = _flatten_outputs(torch, reference)
        return _compile_exported(module, example, names, count, container, device, dynamic_batch, output_names,
                                 threads, allow_fallback, cache_dir)
    finally:
        if saved is not None:
            with torch.no_grad():
                for key, value in module.state_dict().items():
                    value.copy_(saved[key])


def _compile_exported(module, example, names, count, container, device, dynamic_batch, output_names, threads,
                      allow_fallback, cache_dir) -> "CompiledModule":
    torch = _torch()
    if output_names:
        outs = list(output_names)
        if len(outs) != count:
            raise ValueError(f"{len(outs)} output names for the module's {count} outputs")
    else:
        outs = ["output"] if count == 1 else [f"output_{i}" for i in range(count)]
    workdir = tempfile.mkdtemp(prefix="kiln-compile-")
    try:
        path = os.path.join(workdir, "model.onnx")
        mode = torch.onnx.TrainingMode.PRESERVE if module.training else torch.onnx.TrainingMode.EVAL
        export_onnx(module, example, path, names, outs, dynamic_batch, mode, constant_folding=True)
        try:
            model = load(path, device, threads=threads, allow_fallback=allow_fallback, cache_dir=cache_dir)
        except (_kiln.ModelError, _kiln.UnsupportedError) as e:
            # The file is the exporter's: what does not import is what Kiln
            # cannot compile.
            hint = ""
            if module.training:
                hint = (
                    "\n(the module is in training mode: call module.eval() before kiln.compile to compile it for "
                    "inference; kiln.Trainer trains it)"
                )
            raise _kiln.UnsupportedError(f"Kiln cannot compile the exported module: {e}{hint}") from e
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return CompiledModule(model, container, workdir)


def register_backend() -> bool:
    """Registers the ``"kiln"`` backend of ``torch.compile`` where PyTorch has one (2.x).

    ``torch.compile(model, backend="kiln")`` then hands each captured graph
    to :func:`compile` (static shapes, on the CPU unless the graph's inputs
    are CUDA tensors). Returns whether it was registered.
    """
    try:
        import torch
        from torch._dynamo import register_backend as register  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - PyTorch 1.x, or no PyTorch at all
        return False

    class WithSizes(torch.nn.Module):
        """A captured graph with its size arguments fixed: the tensors alone are its inputs."""

        def __init__(self, gm: Any, sizes: Dict[int, Any], count: int) -> None:
            super().__init__()
            self.gm = gm
            self.sizes = sizes
            self.count = count
            self.train(gm.training)

        def forward(self, *tensors: Any) -> Any:
            rest = iter(tensors)
            return self.gm(*[self.sizes[i] if i in self.sizes else next(rest) for i in range(self.count)])

    def kiln_backend(gm: Any, example_inputs: List[Any]) -> Callable[..., Any]:
        # Eval-mode attention without gradients is one fused op the ONNX
        # exporter cannot translate (kiln/_fastpath.py).
        gm = replace_fast_path_ops(gm)
        on_cuda = any(isinstance(x, torch.Tensor) and x.device.type == "cuda" for x in example_inputs)
        device = "cuda" if on_cuda else "cpu"
        if all(isinstance(x, torch.Tensor) for x in example_inputs):
            compiled = compile(gm, tuple(example_inputs), device=device, dynamic_batch=False)

            def run(*args: Any) -> Any:
                out = compiled(*args)
                return out if isinstance(out, (tuple, list)) else (out,)

            return run

        # Dynamo made some dims dynamic (its automatic dynamic shapes: the
        # code it compiles, such as nn.Module's call, saw other sizes before,
        # from this module or another one) and passes them as SymInt
        # arguments. Kiln compiles static shapes: each set of sizes the graph
        # is called with compiles once, with the sizes fixed in the graph.
        programs: Dict[Any, Any] = {}

        def run_per_sizes(*args: Any) -> Any:
            tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
            key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
            program = programs.get(key)
            if program is None:
                sizes = {i: a for i, a in enumerate(args) if not isinstance(a, torch.Tensor)}
                program = compile(WithSizes(gm, sizes, len(args)), tensors, device=device, dynamic_batch=False)
                programs[key] = program
            out = program(*tensors)
            return out if isinstance(out, (tuple, list)) else (out,)

        return run_per_sizes

    try:
        register(name="kiln")(kiln_backend)
    except TypeError:  # an older signature: register_backend(fn), named after it
        kiln_backend.__name__ = "kiln"
        register(kiln_backend)
    return True
