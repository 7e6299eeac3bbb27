"""kiln.Trainer: Kiln's training step (forward, loss, backward and optimizer update in one compiled program) from Python."""

from __future__ import annotations

import collections
import copy
import os
import shutil
import tempfile
import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from kiln import _kiln
from kiln._model import KilnWarning, _is_torch_tensor, check_device, default_cache_dir, python_errors
from kiln._torch import _torch, export_onnx

# What the engine says of a model file that imports only with its input's
# shape known (training/TrainableModel.h's kNeedsFirstBatch).
_NEEDS_FIRST_BATCH = "its signature is read with the first batch's shape"


def _array(value: Any, what: str) -> np.ndarray:
    if _is_torch_tensor(value):
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        return np.asarray(value)
    raise _kiln.InputError(f"{what} is a {type(value).__name__}; expected a NumPy array or a torch tensor")


def _loss_name(loss: Any) -> Tuple[Any, Dict[str, Any]]:
    """A loss name, or PyTorch's loss module (CrossEntropyLoss, NLLLoss, MSELoss) as a name and its options."""
    if isinstance(loss, str):
        return loss, {}
    kind = {"CrossEntropyLoss": "cross_entropy", "NLLLoss": "nll", "MSELoss": "mse"}.get(type(loss).__name__)
    if kind is None or not type(loss).__module__.startswith("torch"):
        raise ValueError(
            f"loss={loss!r}: expected 'cross_entropy', 'nll' or 'mse', or torch.nn.CrossEntropyLoss, NLLLoss or MSELoss"
        )
    if getattr(loss, "weight", None) is not None:
        raise ValueError(f"loss={loss!r}: class weights are not supported")
    options: Dict[str, Any] = {"reduction": loss.reduction}
    if kind != "mse":
        options["ignore_index"] = loss.ignore_index
    if kind == "cross_entropy":
        options["label_smoothing"] = loss.label_smoothing
    return kind, options


def _optimizer_name(optimizer: Any) -> Any:
    """An optimizer name, or PyTorch's optimizer class (torch.optim.SGD, Adam, AdamW) as a name."""
    if isinstance(optimizer, str):
        return optimizer
    name = getattr(optimizer, "__name__", None)
    if isinstance(optimizer, type) and name in ("SGD", "Adam", "AdamW") and optimizer.__module__.startswith("torch"):
        return name.lower()
    raise ValueError(f"optimizer={optimizer!r}: expected 'sgd', 'adam' or 'adamw', or torch.optim.SGD, Adam or AdamW")


def _undo_shared_weights(path: str) -> None:
    """Gives each weight its own initializer again in the ONNX file at ``path``.

    PyTorch's exporter keeps one initializer for weights of equal values and
    feeds the others through Identity nodes: a fresh batch norm's running
    variance becomes Identity(its weight), both ones. Trained, the two would
    be one value. Each such Identity of an initializer becomes an initializer
    of its own, named by the Identity's output (the module's key).
    """
    import onnx

    model = onnx.load(path)
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    kept = []
    changed = False
    for node in graph.node:
        if node.op_type == "Identity" and len(node.input) == 1 and node.input[0] in initializers:
            copy = onnx.TensorProto()
            copy.CopyFrom(initializers[node.input[0]])
            copy.name = node.output[0]
            graph.initializer.append(copy)
            initializers[copy.name] = copy
            changed = True
        else:
            kept.append(node)
    if changed:
        del graph.node[:]
        graph.node.extend(kept)
        onnx.save(model, path)


class Trainer:
    """Trains a ``torch.nn.Module`` or a model file with Kiln.

    Each step is one compiled program: the forward pass, the loss, the
    backward pass and the optimizer's update, which follows ``torch.optim``
    formula for formula (SGD with momentum, dampening and Nesterov; Adam;
    AdamW). One program is compiled per batch size. Batch norms train as in
    ``model.train()`` (``batch_norm="frozen"``: as in ``model.eval()``).

    A module is exported to ONNX at the first step, with that batch's shape
    (any batch size later); its parameters keep their names, and
    :meth:`state_dict` returns the trained values under the module's own
    keys, so ``module.load_state_dict(trainer.state_dict())`` works. Dropout
    is not applied (the module is exported as in eval mode), with a warning
    when the module has any.

    ``loss``: ``"cross_entropy"``, ``"nll"`` or ``"mse"`` (or PyTorch's
    ``CrossEntropyLoss``, ``NLLLoss`` or ``MSELoss`` object, whose reduction,
    ignore_index and label_smoothing are taken); class losses take
    integer labels and the classes in dim 1 of the output (``classes_last``:
    the last dim). ``optimizer``: ``"sgd"``, ``"adam"`` or ``"adamw"`` (or
    ``torch.optim.SGD``, ``Adam`` or ``AdamW``, the class);
    ``weight_decay`` defaults to PyTorch's (0, and 0.01 for AdamW).
    ``precision``: ``"bf16"`` (or ``"fp16"``) runs the step's matmuls and
    convolutions, forward and backward, on low-precision inputs with f32
    accumulation, keeping f32 master weights and optimizer state
    (docs/precision.md); ``"tf32"`` lets CUDA round f32 products to TF32.
    """

    def __init__(
        self,
        module_or_path: Any,
        loss: str = "cross_entropy",
        optimizer: str = "sgd",
        lr: float = 0.01,
        *,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: Optional[float] = None,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        batch_size: int = 32,
        reduction: str = "mean",
        ignore_index: int = -100,
        label_smoothing: float = 0.0,
        classes_last: bool = False,
        batch_norm: str = "train",
        bn_momentum: Optional[float] = None,
        device: str = "cpu",
        threads: int = 0,
        cache_dir: Optional[str] = None,
        check_numerics: bool = False,
        precision: str = "fp32",
    ) -> None:
        loss, loss_options = _loss_name(loss)
        reduction = loss_options.get("reduction", reduction)
        ignore_index = loss_options.get("ignore_index", ignore_index)
        label_smoothing = loss_options.get("label_smoothing", label_smoothing)
        optimizer = _optimizer_name(optimizer)
        if loss not in ("cross_entropy", "nll", "mse"):
            raise ValueError(f"loss='{loss}': expected 'cross_entropy', 'nll' or 'mse'")
        if optimizer not in ("sgd", "adam", "adamw"):
            raise ValueError(f"optimizer='{optimizer}': expected 'sgd', 'adam' or 'adamw'")
        if reduction not in ("mean", "sum"):
            raise ValueError(f"reduction='{reduction}': expected 'mean' or 'sum'")
        if batch_norm not in ("train", "frozen"):
            raise ValueError(f"batch_norm='{batch_norm}': expected 'train' or 'frozen'")
        if int(batch_size) < 1:
            raise ValueError(f"batch_size={batch_size}: expected at least 1")
        if optimizer != "sgd" and (momentum or dampening or nesterov):
            raise ValueError("momentum, dampening and nesterov apply to optimizer='sgd'")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("nesterov=True needs momentum > 0 and dampening 0, as in torch.optim.SGD")
        if precision not in ("fp32", "tf32", "bf16", "fp16"):
            raise ValueError(f"precision='{precision}': expected 'fp32', 'tf32', 'bf16' or 'fp16'")
        if weight_decay is None:
            weight_decay = 0.01 if optimizer == "adamw" else 0.0
        check_device(device)
        self._options: Dict[str, Any] = {
            "loss": loss,
            "reduction": reduction,
            "ignore_index": int(ignore_index),
            "label_smoothing": float(label_smoothing),
            "classes_last": bool(classes_last),
            "optimizer": optimizer,
            "lr": float(lr),
            "momentum": float(momentum),
            "dampening": float(dampening),
            "nesterov": bool(nesterov),
            "weight_decay": float(weight_decay),
            "beta1": float(betas[0]),
            "beta2": float(betas[1]),
            "eps": float(eps),
            "batch_size": int(batch_size),
            "batch_norm": batch_norm,
            "bn_momentum": bn_momentum,
            "device": device,
            "threads": int(threads),
            "cache_dir": default_cache_dir() if cache_dir is None else cache_dir,
            "zero_inputs": [],
            "check_numerics": bool(check_numerics),
            "precision": precision,
            "first_batch_shape": None,
        }
        self._module = None
        self._path: Optional[str] = None
        self._workdir: Optional[str] = None
        self._engine: Optional[_kiln.Trainer] = None
        # module state_dict key -> the exported model's weight name
        self._names: Dict[str, str] = {}
        self._initial: Dict[str, Any] = {}
        self._pending_load = False
        if isinstance(module_or_path, (str, os.PathLike)):
            self._path = os.fspath(module_or_path)
            try:
                with python_errors():
                    self._engine = _kiln.Trainer(self._path, self._options)
            except _kiln.Error as e:
                # A model that computes shapes from its input's imports only
                # with a batch's shape: its engine is made at the first step.
                if _NEEDS_FIRST_BATCH not in str(e):
                    raise
        else:
            torch = _torch()
            if not isinstance(module_or_path, torch.nn.Module):
                raise TypeError(
                    f"kiln.Trainer takes a torch.nn.Module or a model file's path, got a {type(module_or_path).__name__}"
                )
            self._module = module_or_path
            self._initial = {k: v.detach().clone() for k, v in module_or_path.state_dict().items()}

    # -- the engine ---------------------------------------------------------

    def _engine_for(self, path: str, x: np.ndarray) -> "_kiln.Trainer":
        options = dict(self._options)
        options["first_batch_shape"] = [int(d) for d in x.shape]
        with python_errors():
            return _kiln.Trainer(path, options)

    def _ensure(self, x: np.ndarray) -> "_kiln.Trainer":
        if self._engine is not None:
            return self._engine
        if self._module is None:
            assert self._path is not None
            self._engine = self._engine_for(self._path, x)
            return self._engine
        torch = _torch()
        module = self._module
        if any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 for m in module.modules()):
            warnings.warn(
                "kiln.Trainer trains without dropout: the module is exported as in eval mode", KilnWarning, stacklevel=3
            )
        if self._workdir is None:
            self._workdir = tempfile.mkdtemp(prefix="kiln-trainer-")
        path = os.path.join(self._workdir, "model.onnx")
        if self._pending_load:
            # load_state_dict() before the first step: the weights given,
            # without touching the caller's module.
            module = copy.deepcopy(module)
            with torch.no_grad():
                module.load_state_dict(self._initial, strict=True)
        example = torch.from_numpy(np.ascontiguousarray(x[:1]))
        was_training = module.training
        module.eval()
        try:
            export_onnx(
                module, (example,), path, ["input"], ["output"], dynamic_batch=True,
                training=torch.onnx.TrainingMode.PRESERVE, constant_folding=False,
            )
        finally:
            module.train(was_training)
        _undo_shared_weights(path)
        names = self._map_names(path)
        engine = self._engine_for(path, x)
        unmapped = [p for p in engine.parameters if p not in names.values()]
        if unmapped:
            raise _kiln.UnsupportedError(
                "kiln.Trainer cannot map the exported weights "
                + ", ".join(f"'{p}'" for p in unmapped)
                + " back to parameters of the module (PyTorch's exporter rewrote them, as it does for LSTM and "
                "GRU weights), so state_dict() could not return them; export the module to ONNX yourself and "
                "train the file with kiln.Trainer(path)"
            )
        self._names = names
        self._path = path
        self._engine = engine
        return engine

    def _map_names(self, path: str) -> Dict[str, str]:
        """Each state_dict key of the module -> the exported weight holding it: by name, else by equal values."""
        import onnx
        from onnx import numpy_helper

        graph = onnx.load(path).graph
        weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
        names: Dict[str, str] = {}
        claimed = set()
        for key, value in self._initial.items():
            if key in weights:
                names[key] = key
                claimed.add(key)
        for key, value in self._initial.items():
            if key in names or not value.is_floating_point():
                continue
            array = value.cpu().numpy()
            for name, weight in weights.items():
                if name not in claimed and weight.shape == array.shape and np.array_equal(weight, array):
                    names[key] = name
                    claimed.add(name)
                    break
        return names

    # -- training -----------------------------------------------------------

    @property
    def lr(self) -> float:
        """The base learning rate; setting it applies from the next step."""
        return self._options["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        self._options["lr"] = float(value)
        if self._engine is not None:
            self._engine.set_lr(float(value))

    @property
    def steps(self) -> int:
        """Steps trained so far."""
        return self._engine.steps if self._engine is not None else 0

    def step(self, x: Any, y: Any) -> float:
        """One training step on the batch ``(x, y)``; returns its loss.

        ``x``: the model input, one sample per row. ``y``: integer class
        labels for class losses, float targets shaped like the output for
        ``"mse"``.
        """
        xs, ys = _array(x, "x"), _array(y, "y")
        if xs.ndim == 0:
            raise _kiln.InputError("kiln.Trainer.step(): 'x' is a scalar; expected one sample per row")
        engine = self._ensure(xs)
        with python_errors():
            loss, notices = engine.step(xs, ys, "kiln.Trainer.step()")
        for notice in notices:
            warnings.warn(notice, KilnWarning, stacklevel=2)
        return loss

    def fit(
        self,
        x: Any,
        y: Any,
        epochs: int = 1,
        batch_size: Optional[int] = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
        verbose: bool = False,
    ) -> List[float]:
        """Trains ``epochs`` passes over ``(x, y)`` in batches; returns each epoch's mean loss.

        Each epoch visits the samples in an order drawn from ``seed`` and the
        epoch (``shuffle=False``: in order). ``batch_size`` defaults to the
        trainer's; a last partial batch is trained unless ``drop_last``.
        """
        xs, ys = _array(x, "x"), _array(y, "y")
        if xs.ndim == 0 or ys.ndim == 0:
            raise _kiln.InputError("kiln.Trainer.fit(): x and y need one row per sample")
        if len(xs) != len(ys):
            raise _kiln.InputError(
                f"kiln.Trainer.fit(): 'x' holds {len(xs)} samples but 'y' holds {len(ys)} labels; "
                "expected one label per sample"
            )
        size = int(batch_size or self._options["batch_size"])
        if size < 1:
            raise ValueError(f"batch_size={batch_size}: expected at least 1")
        history: List[float] = []
        for epoch in range(int(epochs)):
            order = np.random.default_rng([seed, epoch]).permutation(len(xs)) if shuffle else np.arange(len(xs))
            losses: List[float] = []
            for start in range(0, len(xs), size):
                rows = order[start : start + size]
                if drop_last and len(rows) < size:
                    break
                losses.append(self.step(xs[rows], ys[rows]))
            mean = float(np.mean(losses)) if losses else float("nan")
            history.append(mean)
            if verbose:
                print(f"epoch {epoch + 1}/{epochs}: loss {mean:.6g} ({len(losses)} steps)")
        return history

    def evaluate(self, x: Any, y: Any) -> Dict[str, float]:
        """The current parameters' mean loss on ``(x, y)`` and, for class losses, their accuracy.

        Batch norms use their running statistics, as in ``model.eval()``.
        """
        xs, ys = _array(x, "x"), _array(y, "y")
        engine = self._ensure(xs)
        with python_errors():
            return engine.evaluate(xs, ys, "kiln.Trainer.evaluate()")

    # -- results ------------------------------------------------------------

    def _state(self) -> Dict[str, np.ndarray]:
        assert self._engine is not None
        with python_errors():
            return self._engine.state(self._options["batch_size"])

    def state_dict(self) -> "collections.OrderedDict[str, Any]":
        """The trained weights.

        For a module: its own ``state_dict()`` keys, shapes and dtypes, with
        the trained parameters, the batch norms' running statistics and
        ``num_batches_tracked`` (advanced by the steps trained), so
        ``module.load_state_dict(trainer.state_dict(), strict=True)`` loads
        them. For a model file: NumPy arrays by weight name.
        """
        if self._module is None:
            if self._engine is None or self._engine.steps == 0:
                raise _kiln.Error("no step has run yet: the state of a model file is built with its first step")
            return collections.OrderedDict(self._state())
        torch = _torch()
        state = self._state() if self._engine is not None and self._engine.steps > 0 else {}
        steps = self.steps
        trains_bn = self._options["batch_norm"] == "train"
        out: "collections.OrderedDict[str, Any]" = collections.OrderedDict()
        for key, initial in self._initial.items():
            name = self._names.get(key)
            if name is not None and name in state:
                value = torch.from_numpy(np.array(state[name])).reshape(initial.shape).to(initial.dtype)
            elif key.endswith("num_batches_tracked") and trains_bn:
                value = initial + steps
            else:
                value = initial.clone()
            out[key] = value
        return out

    def load_state_dict(self, state_dict: Any) -> None:
        """Sets the weights from ``state_dict``, as ``module.load_state_dict(state_dict, strict=True)`` does.

        For a module: its own keys, every one of them, with their shapes. The
        parameters and batch norm running statistics take the values (and
        ``num_batches_tracked`` counts on from the one given); the optimizer
        state (momentum, Adam's moments, the step count) is kept, as loading
        a module's weights leaves a torch optimizer's. For a model file:
        NumPy arrays by weight name, after the first step. Everything is
        checked before anything changes: an error leaves the trainer as it was.
        """
        torch = _torch() if self._module is not None else None
        given = dict(state_dict)
        if self._module is None:
            if self._engine is None or self._engine.steps == 0:
                raise _kiln.Error("no step has run yet: the state of a model file is built with its first step")
            current = self._state()
            unknown = [k for k in given if k not in current]
            if unknown:
                raise _kiln.InputError(f"load_state_dict(): unknown weights {unknown}; the model's are {list(current)}")
            values = {k: self._converted(k, given[k], current[k]) for k in given}
            with python_errors():
                self._engine.set_state(values, self._options["batch_size"])
            return
        missing = [k for k in self._initial if k not in given]
        unexpected = [k for k in given if k not in self._initial]
        if missing or unexpected:
            raise _kiln.InputError(
                f"load_state_dict(): missing keys {missing}, unexpected keys {unexpected}; expected the module's "
                "own state_dict() keys"
            )
        for key, initial in self._initial.items():
            value = given[key]
            if not isinstance(value, torch.Tensor) or tuple(value.shape) != tuple(initial.shape):
                shape = tuple(value.shape) if hasattr(value, "shape") else type(value).__name__
                raise _kiln.InputError(
                    f"load_state_dict(): '{key}' is {shape}, the module's is a tensor of shape {tuple(initial.shape)}"
                )
        steps = self.steps
        if self._engine is not None:
            current = self._state()
            values = {}
            for key, name in self._names.items():
                if name in current:
                    values[name] = self._converted(key, given[key], current[name])
            with python_errors():
                self._engine.set_state(values, self._options["batch_size"])
        else:
            # Exported at the first step from a copy of the module holding these.
            self._pending_load = True
        trains_bn = self._options["batch_norm"] == "train"
        for key, value in given.items():
            value = value.detach().clone()
            self._initial[key] = value - steps if key.endswith("num_batches_tracked") and trains_bn else value

    @staticmethod
    def _converted(key: str, value: Any, current: np.ndarray) -> np.ndarray:
        array = np.asarray(value.detach().cpu().numpy() if _is_torch_tensor(value) else value)
        if array.size != current.size:
            raise _kiln.InputError(f"load_state_dict(): '{key}' holds {array.size} values of shape {array.shape}; "
                                   f"the trained weight has shape {current.shape}")
        return np.ascontiguousarray(array.astype(current.dtype, copy=False).reshape(current.shape))

    def __del__(self) -> None:
        if getattr(self, "_workdir", None):
            shutil.rmtree(self._workdir, ignore_errors=True)
