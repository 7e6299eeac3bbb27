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
from kiln._kiln import InputError
from kiln._model import CompiledModel, check_device, load

OPSET = 17


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - PyTorch is a dependency of this function only
        raise _kiln.Error("kiln.compile needs PyTorch (import torch failed: " + str(e) + ")") from e
    return torch


class _Slot:
    """One argument of ``forward`` as compiled: a tensor input of the graph, or a value frozen into it."""

    def __init__(self, name: str, tensor: bool, value: Any = None, bfloat16: bool = False) -> None:
        self.name = name  # forward's parameter
        self.input = name  # the graph's input (input_names renames it)
        self.tensor = tensor
        self.value = value  # a frozen argument's value
        self.bfloat16 = bfloat16  # a bf16 tensor, fed to the graph as f32 and cast inside it


def _is_tensor(torch: Any, value: Any) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray))


def _signature(module: Any) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(module.forward)
    except (TypeError, ValueError):
        return None


def _bind(module: Any, sig: Optional[inspect.Signature], args: Tuple[Any, ...], kwargs: Dict[str, Any],
          what: str) -> List[Tuple[str, Any]]:
    """``forward``'s arguments for a call, defaults included, as (name, value) in order; ``*args`` as name_0, name_1...."""
    if sig is None:
        if kwargs:
            raise InputError(f"{what}: the module's forward has no signature to take keyword arguments by")
        return [(f"input_{i}", v) for i, v in enumerate(args)]
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise InputError(f"{what}: the arguments do not fit {type(module).__name__}.forward{sig}: {e}") from e
    bound.apply_defaults()
    out: List[Tuple[str, Any]] = []
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind == inspect.Parameter.VAR_POSITIONAL:
            out += [(f"{name}_{i}", v) for i, v in enumerate(value)]
        elif kind == inspect.Parameter.VAR_KEYWORD:
            out += list(value.items())
        else:
            out.append((name, value))
    return out


_SCALARS = (bool, int, float, complex, str, type(None))


def _frozen_value(torch: Any, name: str, value: Any) -> Any:
    """A non-tensor argument, checked to be one kiln.compile freezes: a Python scalar, a string, None, or tuples of them."""
    if isinstance(value, _SCALARS) or isinstance(value, np.generic):
        return value
    if isinstance(value, (tuple, list)) and all(isinstance(v, _SCALARS) for v in value):
        return value
    raise _kiln.UnsupportedError(
        f"argument '{name}' of forward is a {type(value).__name__}; kiln.compile takes tensors (the graph's inputs) "
        "and Python scalars, strings, None or tuples of them (frozen into the graph at their compile-time values)"
    )


def _flatten(torch: Any, out: Any, where: str = "the output") -> Tuple[List[Any], Any]:
    """The tensors of a (nested) output and a spec to rebuild it: tensors, tuples, lists, dicts, named tuples, None."""
    if isinstance(out, torch.Tensor):
        return [out], None
    if out is None or isinstance(out, (bool, int, float, str)):
        return [], ("const", out)
    if isinstance(out, dict):
        leaves: List[Any] = []
        specs = []
        for key, value in out.items():
            got, spec = _flatten(torch, value, f"{where}[{key!r}]")
            leaves += got
            specs.append((key, len(got), spec))
        return leaves, ("dict", type(out), specs)
    if isinstance(out, (tuple, list)):
        leaves = []
        specs = []
        for i, value in enumerate(out):
            got, spec = _flatten(torch, value, f"{where}[{i}]")
            leaves += got
            specs.append((len(got), spec))
        return leaves, ("seq", type(out), specs)
    raise _kiln.UnsupportedError(
        f"{where} of the module is a {type(out).__name__}; kiln.compile takes modules that return tensors in "
        "(nested) tuples, lists and dicts"
    )


def _unflatten(spec: Any, leaves: List[Any]) -> Any:
    if spec is None:
        return leaves[0]
    if spec[0] == "const":
        return spec[1]
    if spec[0] == "dict":
        _, kind, items = spec
        out = {}
        at = 0
        for key, count, sub in items:
            out[key] = _unflatten(sub, leaves[at : at + count])
            at += count
        return out if kind is dict else kind(out)
    _, kind, items = spec
    values = []
    at = 0
    for count, sub in items:
        values.append(_unflatten(sub, leaves[at : at + count]))
        at += count
    if kind in (tuple, list):
        return kind(values)
    return kind(*values)  # a named tuple


def _as_tensor(torch: Any, value: Any) -> Any:
    return value if isinstance(value, torch.Tensor) else torch.from_numpy(np.asarray(value))


def _exported_module(torch: Any, module: Any, sig: Optional[inspect.Signature], slots: List[_Slot],
                     bf16_outputs: List[bool]) -> Any:
    """``module`` as the exporter sees it: only the tensor arguments as inputs (frozen values bound inside),
    the outputs flattened to a tuple, bf16 fed and returned as f32 with casts in the graph."""

    class Exported(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = module

        def forward(self, *tensors: Any) -> Any:
            positional, keywords = _call_arguments(torch, sig, slots, list(tensors))
            leaves, _ = _flatten(torch, self.inner(*positional, **keywords))
            return tuple(leaf.float() if bf16 else leaf for leaf, bf16 in zip(leaves, bf16_outputs))

    return Exported()


def _is_var_positional(sig: inspect.Signature, name: str) -> bool:
    return any(p.kind == inspect.Parameter.VAR_POSITIONAL and name.startswith(p.name + "_")
               for p in sig.parameters.values())


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
    dynamic_axes: Optional[Dict[str, Dict[int, str]]] = None,
) -> None:
    """torch.onnx.export with Kiln's settings; its failures become kiln.UnsupportedError."""
    torch = _torch()
    axes: Dict[str, Dict[int, str]] = {}
    if dynamic_batch:
        for name, x in zip(input_names, example):
            if x.dim() > 0:
                axes[name] = {0: "batch"}
        for name in output_names:
            axes[name] = {0: "batch"}
    for name, dims in (dynamic_axes or {}).items():
        axes.setdefault(name, {}).update(dims)
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


def _normalize_axes(dynamic_axes: Any, slots: List["_Slot"], example: Dict[str, Any]) -> Dict[str, Dict[int, str]]:
    """``dynamic_axes`` as torch.onnx.export takes it ({input: {dim: name}} or {input: [dims]}), checked."""
    if dynamic_axes is None:
        return {}
    if not isinstance(dynamic_axes, dict):
        raise TypeError(f"dynamic_axes is a {type(dynamic_axes).__name__}; expected a dict such as "
                        "{'tokens': {1: 'sequence'}}")
    tensors = [s.input for s in slots if s.tensor]
    out: Dict[str, Dict[int, str]] = {}
    for name, dims in dynamic_axes.items():
        if name not in tensors:
            raise ValueError(f"dynamic_axes names '{name}', which is not a tensor argument of forward "
                             f"(those are: {', '.join(tensors) or 'none'})")
        if isinstance(dims, dict):
            items = list(dims.items())
        elif isinstance(dims, (list, tuple)):
            items = [(d, f"{name}_dim{d}") for d in dims]
        else:
            raise TypeError(f"dynamic_axes['{name}'] is a {type(dims).__name__}; expected a dict {{dim: name}} "
                            "or a list of dims")
        rank = example[name].dim()
        out[name] = {}
        for dim, symbol in items:
            if not isinstance(dim, int) or not -rank <= dim < rank:
                raise ValueError(f"dynamic_axes['{name}'] names dim {dim!r}, but '{name}' has rank {rank} "
                                 f"(shape {tuple(example[name].shape)})")
            out[name][dim % rank] = str(symbol)
    return out


class CompiledModule:
    """A torch.nn.Module compiled by Kiln (:func:`compile`): call it as the module.

    It runs the whole graph in Kiln, never in PyTorch: the module is not
    called again, so changing it (its ``forward``, its weights) after
    compiling changes nothing here. It takes ``forward``'s arguments as the
    module does (positionally or by name, defaults filled in): tensors are
    the graph's inputs, other arguments (Python scalars, strings, None) are
    frozen at their compile-time values, and a call with another value is
    refused. Arguments the graph does not use are ignored. It returns the
    module's structure (tensors in nested tuples, lists and dicts). Torch
    tensors in give torch tensors out; NumPy arrays give NumPy arrays.
    """

    def __init__(self, model: CompiledModel, container: Any, workdir: str, module: Any = None,
                 slots: Optional[List[_Slot]] = None, sig: Optional[inspect.Signature] = None,
                 bf16_outputs: Optional[List[bool]] = None) -> None:
        self.model = model
        self._spec = container
        self._workdir = workdir
        self._module_name = type(module).__name__ if module is not None else "module"
        self._slots = slots
        self._sig = sig
        self._bf16_outputs = bf16_outputs or []
        self._used = {p.name for p in model.inputs}

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
        if self._slots is None:
            return self.model(*args, **kwargs)
        torch = _torch()
        # Inputs renamed by input_names may be given by those names too.
        renamed = {s.input: s.name for s in self._slots if s.tensor and s.input != s.name}
        kwargs = {renamed.get(k, k) if k not in [s.name for s in self._slots] else k: v for k, v in kwargs.items()}
        given = _bind(self, self._sig, args, kwargs, "the compiled module's call")
        by_name = dict(given)
        named = [s.name for s in self._slots]
        for name in by_name:
            if name not in named:
                raise InputError(f"argument '{name}' was not an argument when the module was compiled "
                                 f"(its arguments were: {', '.join(named) or 'none'})")
        feeds: Dict[str, Any] = {}
        bf16 = False
        for slot in self._slots:
            if slot.name not in by_name:
                raise InputError(f"argument '{slot.name}' is missing")
            value = by_name[slot.name]
            if not slot.tensor:
                if _is_tensor(torch, value) or not _same(value, slot.value):
                    raise InputError(
                        f"argument '{slot.name}' is {_short(value)}, but the module was compiled with "
                        f"{slot.name}={slot.value!r}, which is frozen into the compiled graph; call it with that "
                        "value, or compile again (kiln.compile) with the new one"
                    )
                continue
            if not _is_tensor(torch, value):
                raise InputError(f"argument '{slot.name}' is {_short(value)}; it was a tensor when the module "
                                 "was compiled, and is an input of the compiled graph")
            if slot.input not in self._used:
                continue  # forward does not use it: the graph has no such input
            if slot.bfloat16:
                if not (isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16):
                    kind = "tensor" if isinstance(value, torch.Tensor) else "array"
                    raise InputError(f"argument '{slot.name}' is a {_dtype_name(value)} {kind}; the module was "
                                     "compiled with a torch.bfloat16 tensor there (NumPy has no bfloat16)")
                bf16 = True
                value = value.float()  # exact; the graph casts it back to bf16 first
            feeds[slot.input] = value
        out = self.model(**feeds)
        leaves = list(out) if len(self.model.outputs) != 1 else [out]
        if bf16 or any(isinstance(leaf, torch.Tensor) for leaf in leaves):
            leaves = [torch.from_numpy(leaf) if isinstance(leaf, np.ndarray) else leaf for leaf in leaves]
            leaves = [leaf.to(torch.bfloat16) if b else leaf for leaf, b in zip(leaves, self._bf16_outputs)]
        return _unflatten(self._spec, leaves)

    def save(self, path) -> None:
        """Writes the compiled program (``.kc``) for the last call's shapes; see CompiledModel.save."""
        self.model.save(path)

    def __del__(self) -> None:
        shutil.rmtree(getattr(self, "_workdir", ""), ignore_errors=True)

    def __repr__(self) -> str:
        return f"<kiln.CompiledModule on {self.device}>"


def _same(a: Any, b: Any) -> bool:
    try:
        return type(a) == type(b) and bool(a == b)  # noqa: E721 - 1 and True and 1.0 compile differently
    except Exception:  # noqa: BLE001 - values that do not compare
        return False


def _short(value: Any) -> str:
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"a {type(value).__name__} of shape {tuple(value.shape)}"
    return repr(value)


def _dtype_name(value: Any) -> str:
    return str(getattr(value, "dtype", type(value).__name__))


def compile(
    module: Any,
    example_inputs: Any,
    device: str = "cpu",
    dynamic_batch: bool = True,
    *,
    dynamic_axes: Optional[Dict[str, Any]] = None,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
    threads: int = 0,
    allow_fallback: bool = True,
    cache_dir: Optional[str] = None,
    precision: str = "fp32",
) -> CompiledModule:
    """Compiles a ``torch.nn.Module`` with Kiln.

    The module is exported to ONNX in memory (``torch.onnx.export``, opset
    17, in the mode the module is in: call ``module.eval()`` for inference)
    with ``example_inputs`` (a tensor or a tuple of ``forward``'s
    arguments), then compiled for ``device`` like :func:`load`.

    - Tensor arguments are the graph's inputs, named after ``forward``'s
      parameters (``input_names`` overrides). Other arguments, given or
      left to their defaults (Python scalars, strings, None), are frozen
      into the graph at their values; a call with another value raises
      :class:`InputError`. Arguments ``forward`` does not use are ignored.
    - With ``dynamic_batch`` the first dim of every input and output is
      dynamic. ``dynamic_axes`` makes more dims dynamic, as
      ``torch.onnx.export``'s: ``{"tokens": {1: "sequence"}}`` or
      ``{"tokens": [1]}``. Other shapes compile on first use.
    - Outputs keep the module's structure: tensors in nested tuples, lists,
      dicts and named tuples.
    - ``precision`` (``"fp32"``, ``"tf32"``, ``"bf16"``, ``"fp16"``) as for
      :func:`load`: what ``torch.autocast`` does, as a graph transform.
    - float16 tensors are taken as they are; bfloat16 tensors (which NumPy
      lacks) go in and out as float32 with casts inside the graph, which is
      exact, and come back as torch.bfloat16.

    Raises :class:`UnsupportedError` naming what Kiln cannot compile (every
    unsupported op, or the exporter's failure), and :class:`DeviceError` when
    ``device`` is not usable; never falls back to PyTorch or to the CPU.
    """
    torch = _torch()
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"kiln.compile takes a torch.nn.Module, got a {type(module).__name__}")
    check_device(device)
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
    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    for i, value in enumerate(example_inputs):
        if not (_is_tensor(torch, value) or isinstance(value, _SCALARS) or isinstance(value, (tuple, list))):
            raise TypeError(f"example_inputs[{i}] is a {type(value).__name__}; expected a torch tensor, a NumPy "
                            "array or a Python scalar")
    sig = _signature(module)
    given = _bind(module, sig, tuple(example_inputs), {}, "example_inputs")
    slots: List[_Slot] = []
    example: List[Any] = []
    for name, value in given:
        if _is_tensor(torch, value):
            tensor = _as_tensor(torch, value)
            slots.append(_Slot(name, True, bfloat16=tensor.dtype == torch.bfloat16))
            example.append(tensor.float() if tensor.dtype == torch.bfloat16 else tensor)
        else:
            slots.append(_Slot(name, False, _frozen_value(torch, name, value)))
    names = [s.name for s in slots if s.tensor]
    if input_names:
        if len(input_names) != len(names):
            raise ValueError(f"{len(input_names)} input names for the {len(names)} tensor arguments "
                             f"({', '.join(names)})")
        for slot, new in zip([s for s in slots if s.tensor], input_names):
            slot.input = str(new)
        names = list(map(str, input_names))
    axes = _normalize_axes(dynamic_axes, slots, dict(zip(names, example)))
    # Running the module in training mode (here and in the exporter's trace)
    # updates its batch norms' running statistics: they are put back after.
    saved = {k: v.detach().clone() for k, v in module.state_dict().items()} if module.training else None
    try:
        with torch.no_grad():
            positional, keywords = _call_arguments(torch, sig, slots, example)
            reference = module(*positional, **keywords)
        leaves, spec = _flatten(torch, reference)
        if not leaves:
            raise _kiln.UnsupportedError("the module returns no tensor; kiln.compile compiles what it computes")
        bf16_outputs = [leaf.dtype == torch.bfloat16 for leaf in leaves]
        wrapper = _exported_module(torch, module, sig, slots, bf16_outputs)
        wrapper.train(module.training)
        return _compile_exported(wrapper, module, tuple(example), names, len(leaves), spec, device, dynamic_batch,
                                 output_names, threads, allow_fallback, cache_dir, axes, slots, sig, bf16_outputs,
                                 precision)
    finally:
        if saved is not None:
            with torch.no_grad():
                for key, value in module.state_dict().items():
                    value.copy_(saved[key])


def _call_arguments(torch: Any, sig: Optional[inspect.Signature], slots: List[_Slot],
                    example: List[Any]) -> Tuple[List[Any], Dict[str, Any]]:
    """The module's call with the example: bf16 tensors as bf16, frozen values in their places."""
    values = iter(example)
    positional: List[Any] = []
    keywords: Dict[str, Any] = {}
    for slot in slots:
        value = next(values) if slot.tensor else slot.value
        if slot.tensor and slot.bfloat16:
            value = value.to(torch.bfloat16)
        param = sig.parameters.get(slot.name) if sig is not None else None
        if param is not None and param.kind == inspect.Parameter.KEYWORD_ONLY:
            keywords[slot.name] = value
        elif param is None and sig is not None and not _is_var_positional(sig, slot.name):
            keywords[slot.name] = value  # a **kwargs entry
        else:
            positional.append(value)
    return positional, keywords


def _compile_exported(wrapper, module, example, names, count, spec, device, dynamic_batch, output_names, threads,
                      allow_fallback, cache_dir, axes, slots, sig, bf16_outputs, precision) -> "CompiledModule":
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
        export_onnx(wrapper, example, path, names, outs, dynamic_batch, mode, constant_folding=True,
                    dynamic_axes=axes)
        try:
            model = load(path, device, threads=threads, allow_fallback=allow_fallback, cache_dir=cache_dir,
                         precision=precision)
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
    return CompiledModule(model, spec, workdir, module, slots, sig, bf16_outputs)


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
