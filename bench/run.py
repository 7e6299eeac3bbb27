#!/usr/bin/env python3
"""Benchmarks Kiln against PyTorch eager and ONNX Runtime on the end-to-end models.

The models are those of scripts/export-e2e-models.py (imported, not copied),
exported here with a dynamic batch dimension and run at batch 1 and at a large
batch. Each system runs with 2 threads:

  Kiln          `kiln run MODEL --input ... --bench N --warmup W --threads 2 --json`, in the
                environment users run it in (--kiln-omp-passive: with OMP_WAIT_POLICY=PASSIVE)
  PyTorch       eager, torch.inference_mode(), torch.set_num_threads(2), in a worker
                process with OPENBLAS_CORETYPE=SkylakeX, OMP_NUM_THREADS=2, OMP_WAIT_POLICY=PASSIVE (and
                Debian's OpenMP OpenBLAS as libblas.so.3: scripts/install-bench-deps)
  ONNX Runtime  intra_op_num_threads=2, inter_op_num_threads=1, ORT_ENABLE_ALL,
                in its own worker process

First every configuration is run once by each system and the outputs must agree
(rtol 1e-3, atol 1e-4); then timing goes in rounds, each round running every
system once per configuration (N timed runs after W warm-up runs), so that
drifts of the machine's load hit all three alike. A configuration's time is the
median of its per-round medians. A system that fails on a model is reported and
the others go on. The report (Markdown: machine, versions, table, geometric
means of the ratios) goes to stdout and, with --output, to a file.

  .venv-bench/bin/python bench/run.py [--kiln build/tools/kiln] [--rounds 8] [--runs 5] [--output FILE]
"""
import argparse
import datetime
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (model in export-e2e-models.py, name in the table, large batch). The
# attention models come from their `*-dynamic` exports.
MODELS = [("mlp", "mlp", 64), ("cnn", "cnn", 64), ("rnn", "rnn", 64), ("lstm", "lstm", 64), ("gru", "gru", 64),
          ("transformer-dynamic", "transformer", 16), ("gpt-dynamic", "gpt", 16)]
RTOL, ATOL = 1e-3, 1e-4
SYSTEMS = ("kiln", "torch", "ort")
# Training-step rows: (model in export-e2e-models.py, name in the table, batch). One step is forward,
# F.cross_entropy (the GPT's over its token scores against the next tokens), zero_grad, backward and
# optimizer.step(), from the same weights and batch in both systems.
TRAIN_MODELS = [("mlp", "mlp", 256), ("cnn", "cnn", 64), ("gpt-dynamic", "gpt", 8)]
TRAIN_SYSTEMS = ("kiln", "torch")
TRAIN_LR = 0.01
# The losses of the first TRAIN_CHECK_STEPS steps must agree to TRAIN_LOSS_RTOL, and so must how far each has
# fallen from the first (to TRAIN_DROP_RTOL of PyTorch's drop): at lr 0.01 the losses move by less than 1e-3 per
# step, so a weight left untrained would pass the first test alone.
TRAIN_LOSS_RTOL = 1e-4
TRAIN_DROP_RTOL = 0.02
# AdamW's first steps move every weight by about lr * sign(gradient), so float differences in gradients near zero
# become lr-sized steps: its losses agree to about 1e-3 (the GPT: 3.6287 against 3.6248 after one step).
TRAIN_LOSS_RTOL_ADAMW = 2e-3
TRAIN_CHECK_STEPS = 5


def load_export_module():
    path = os.path.join(ROOT, "scripts", "export-e2e-models.py")
    spec = importlib.util.spec_from_file_location("export_e2e_models", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def e2e_models(export):
    """The export script's models by name, with the weights its main() gives them."""
    import torch
    torch.manual_seed(0)
    return {name: (module, inputs, outputs, axes) for name, module, inputs, outputs, axes in export.models()}


def batch_inputs(inputs, axes, batch, seed):
    """Inputs like the export's example ones, with each dynamic batch dim set to `batch`."""
    rng = np.random.default_rng(seed)
    result = {}
    for name, value in inputs.items():
        shape = list(value.shape)
        for dim in axes.get(name, {}):
            shape[dim] = batch
        if value.dtype.is_floating_point:
            result[name] = rng.standard_normal(shape).astype(np.float32)
        else:  # token ids of the GPT: below the vocabulary size of the example
            result[name] = rng.integers(0, int(value.max()) + 1, size=shape, dtype=np.int64)
    return result


def train_batch(module, inputs, axes, batch, seed):
    """A training batch: the model's inputs at `batch` and int64 labels. The GPT (integer token input) gets a
    sequence of T + 1 tokens: the first T are its input, the last T its labels (the next tokens); the others
    get random classes below their output width."""
    import torch
    rng = np.random.default_rng(seed)
    if len(inputs) == 1 and not next(iter(inputs.values())).dtype.is_floating_point:
        name, example = next(iter(inputs.items()))
        with torch.no_grad():
            vocab = module(example).shape[-1]
        tokens = rng.integers(0, vocab, size=(batch, example.shape[1] + 1), dtype=np.int64)
        return {name: np.ascontiguousarray(tokens[:, :-1])}, np.ascontiguousarray(tokens[:, 1:])
    batched = batch_inputs(inputs, axes, batch, seed)
    with torch.no_grad():
        classes = module(*[torch.from_numpy(v) for v in batched.values()]).shape[-1]
    return batched, rng.integers(0, classes, size=(batch,), dtype=np.int64)


def torch_optimizer(module, name):
    import torch
    if name == "sgd":
        return torch.optim.SGD(module.parameters(), lr=TRAIN_LR, momentum=0.9)
    return torch.optim.AdamW(module.parameters(), lr=TRAIN_LR)  # weight decay 0.01, PyTorch's default


# --- Workers: PyTorch and ONNX Runtime, each in its own process ------------------------------------------------


def worker_main(system, module_for=None):
    """Serves requests, one JSON object per line on stdin, one reply per line on stdout. The torch worker gets
    each request's module from module_for(model name) (default: the end-to-end models of the export script); its
    weights come from the request's state file."""
    if system == "torch":
        import torch
        torch.set_num_threads(2)
        if module_for is None:
            export = load_export_module()
            module_for = {name: m for name, (m, _, _, _) in e2e_models(export).items()}.__getitem__
    else:
        import onnxruntime as ort
    loaded = {}
    out = sys.stdout
    sys.stdout = sys.stderr  # keep the protocol channel clean
    for line in sys.stdin:
        req = json.loads(line)
        try:
            if req["cmd"] == "version":
                out.write(json.dumps({"ok": True, "version": system_version(system)}) + "\n")
                out.flush()
                continue
            key = req["key"]
            if req["cmd"] == "load":
                inputs = {n: np.load(p) for n, p in req["inputs"].items()}
                if system == "torch":
                    module = module_for(req["model"])
                    module.load_state_dict(torch.load(req["state"]))
                    module.eval()
                    args = tuple(torch.from_numpy(v) for v in inputs.values())
                    # precision "bf16": PyTorch's CPU autocast (bench/real.py --precision bf16).
                    autocast = req.get("precision") == "bf16"

                    def run(module=module, args=args, autocast=autocast):
                        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                            result = module(*args)
                        result = result if isinstance(result, tuple) else (result,)
                        return tuple(r.float() if r.dtype == torch.bfloat16 else r for r in result)
                else:
                    options = ort.SessionOptions()
                    options.intra_op_num_threads = 2
                    options.inter_op_num_threads = 1
                    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
                    session = ort.InferenceSession(req["onnx"], options, providers=["CPUExecutionProvider"])

                    def run(session=session, inputs=inputs):
                        return session.run(None, inputs)
                loaded[key] = run
                outputs = run()
                for name, value in zip(req["output_names"], outputs):
                    np.save(os.path.join(req["output_dir"], name + ".npy"), np.asarray(value))
                reply = {"ok": True}
            elif req["cmd"] == "train_load":
                import torch.nn.functional as F
                module = module_for(req["model"])
                module.load_state_dict(torch.load(req["state"]))
                # None of this script's models has dropout or batch norm, so this changes no value here;
                # bench/real.py's ResNet-18 trains its batch norms in train mode, as kiln-train-bench does.
                module.train()
                optimizer = torch_optimizer(module, req["optimizer"])
                args = tuple(torch.from_numpy(np.load(p)) for p in req["inputs"].values())
                labels = torch.from_numpy(np.load(req["labels"]))

                def run(module=module, args=args, labels=labels, optimizer=optimizer, F=F):
                    scores = module(*args)
                    if scores.dim() == 3:  # [B, T, V] token scores against [B, T] next tokens
                        loss = F.cross_entropy(scores.reshape(-1, scores.shape[-1]), labels.reshape(-1))
                    else:
                        loss = F.cross_entropy(scores, labels)
                    optimizer.zero_grad()
                    loss.backward()
                    optimizer.step()
                    return loss.detach()
                loaded[key] = run
                losses = [float(run()) for _ in range(req["steps"])]
                reply = {"ok": True, "losses": losses}
            else:
                run = loaded[key]
                for _ in range(req["warmup"]):
                    run()
                times = []
                for _ in range(req["runs"]):
                    start = time.perf_counter()
                    run()
                    times.append((time.perf_counter() - start) * 1e3)
                reply = {"ok": True, "times_ms": times}
        except Exception as e:  # reported to the driver, which marks the configuration failed
            reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def system_version(system):
    """What the worker runs, for the report: PyTorch's version and the BLAS it was built with, or ONNX Runtime's."""
    if system != "torch":
        import onnxruntime
        return f"ONNX Runtime {onnxruntime.__version__}"
    import torch
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    blas = blas.group(1) if blas else "unknown"
    if blas == "generic":  # Debian's torch: whatever libblas.so.3 points to (scripts/install-bench-deps)
        blas = "libblas.so.3 -> " + os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    onednn = re.search(r"(?:MKL-DNN|oneDNN) v([\d.]+)", config)
    return (f"PyTorch {torch.__version__} (Python {platform.python_version()} at {sys.executable}; BLAS {blas}"
            f"{', oneDNN ' + onednn.group(1) if onednn else ''})")


class Worker:
    """A worker process: SCRIPT (default this one) run with `--worker SYSTEM` by PYTHON (default this one's
    interpreter), which calls worker_main."""

    def __init__(self, system, env, script=__file__, python=None):
        self.proc = subprocess.Popen([python or sys.executable, os.path.abspath(script), "--worker", system],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def version(self):
        reply = self.call(cmd="version")
        return reply["version"] if reply.get("ok") else f"unknown ({reply.get('error')})"

    def call(self, **req):
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            return {"ok": False, "error": "worker exited"}
        return json.loads(line)

    def close(self):
        self.proc.stdin.close()
        self.proc.wait()


def torch_env():
    env = dict(os.environ)
    # PASSIVE: OpenMP threads sleep instead of spinning at barriers. On a 2-core machine shared with other work a
    # spinning thread that loses its core stalls the other; measured here, the GPT at batch 16 took 20-35 ms
    # with the default policy against 0.6 ms with this one (and 0.4 ms on an idle machine with either).
    env.update(OPENBLAS_CORETYPE="SkylakeX", OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE")
    return env


def ort_env():
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="2")
    return env


# --- Kiln -----------------------------------------------------------------------------------------------------------


KILN_ENV = dict(os.environ)  # --kiln-omp-passive adds OMP_WAIT_POLICY=PASSIVE


def kiln_command(kiln, config):
    cmd = [kiln, "run", config["onnx"], "--threads", "2"]
    for name, path in config["inputs"].items():
        cmd += ["--input", f"{name}={path}"]
    if config.get("precision"):
        cmd += ["--precision", config["precision"]]
    return cmd


def kiln_error(proc):
    text = (proc.stderr or proc.stdout or "").strip().splitlines()
    return text[-1] if text else f"exit status {proc.returncode}"


def run_kiln(cmd, timeout):
    """subprocess.run of a Kiln command; a command that runs past `timeout` seconds (None: no limit) is killed
    and reported as one that failed, with exit status 124."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, env=KILN_ENV, timeout=timeout)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"{os.path.basename(cmd[0])} {cmd[1]}: killed after "
                                           f"{timeout:.0f} s (the timeout)")


def kiln_load(kiln, config, output_dir, timeout=None):
    proc = run_kiln(kiln_command(kiln, config) + ["--no-fallback", "--output-dir", output_dir], timeout)
    return {"ok": True} if proc.returncode == 0 else {"ok": False, "error": kiln_error(proc)}


def take_turn(config, system, workers, kiln_reply, args):
    """One system's timed turn at `config`: Kiln's reply from `kiln_reply()` (a JSON reply with median_ms), the
    others' from their worker's bench command (args.runs timed runs after args.warmup). Appends the median to
    config["rounds"][system], or records the failure in config["failed"][system]. A system named "kiln..." other
    than "kiln" is a variant of Kiln whose reply kiln_reply(system) gives (bench/real.py's "kiln_f32")."""
    if system == "kiln":
        reply = kiln_reply()
        median = reply.get("median_ms")
    elif system.startswith("kiln"):
        reply = kiln_reply(system)
        median = reply.get("median_ms")
    else:
        reply = workers[system].call(cmd="bench", key=config["key"], runs=args.runs, warmup=args.warmup)
        median = statistics.median(reply["times_ms"]) if reply["ok"] else None
    if reply["ok"]:
        config["rounds"][system].append(median)
    else:
        config["failed"][system] = reply["error"]


def kiln_bench(kiln, config, runs, warmup, timeout=None):
    proc = run_kiln(kiln_command(kiln, config) + ["--bench", str(runs), "--warmup", str(warmup), "--json"], timeout)
    if proc.returncode != 0:
        return {"ok": False, "error": kiln_error(proc)}
    return {"ok": True, "median_ms": json.loads(proc.stdout)["median_ms"]}


def kiln_train_command(train_bench, config):
    cmd = [train_bench, config["onnx"], "--threads", "2", "--labels", config["labels"], "--optimizer",
           config["optimizer"], "--lr", str(TRAIN_LR), "--json"]
    for name, path in config["inputs"].items():
        cmd += ["--input", f"{name}={path}"]
    return cmd


def kiln_train(train_bench, config, steps, warmup, timeout=None):
    """Runs kiln-train-bench: `steps` timed steps after `warmup` ones; its JSON reply (median_ms, losses)."""
    proc = run_kiln(kiln_train_command(train_bench, config) + ["--steps", str(steps), "--warmup", str(warmup)],
                    timeout)
    if proc.returncode != 0:
        return {"ok": False, "error": kiln_error(proc)}
    return dict(json.loads(proc.stdout), ok=True)


# --- The driver -----------------------------------------------------------------------------------------------------


def compare(outputs, reference):
    """The largest relative error of `outputs` against `reference` (dicts of arrays), or why they differ."""
    worst = 0.0
    for name, want in reference.items():
        got = outputs.get(name)
        if got is None:
            return None, f"output {name} missing"
        if got.shape != want.shape:
            return None, f"output {name} has shape {got.shape}, want {want.shape}"
        if not np.allclose(got, want, rtol=RTOL, atol=ATOL):
            err = np.max(np.abs(got.astype(np.float64) - want) / (ATOL + RTOL * np.abs(want)))
            return None, f"output {name} differs ({err:.1f}x the tolerance)"
        worst = max(worst, float(np.max(np.abs(got.astype(np.float64) - want) / (np.abs(want) + 1e-6))))
    return worst, None


def read_outputs(folder):
    return {f[:-4]: np.load(os.path.join(folder, f)) for f in os.listdir(folder) if f.endswith(".npy")}


def check_inference(configs, workers, kiln, work, timeout=None):
    """Agreement first: each system runs each configuration once; Kiln's and ORT's outputs are compared with
    PyTorch's. A system that fails or disagrees is recorded in the configuration's "failed" and not timed."""
    for c in configs:
        outputs = {}
        for system in SYSTEMS:
            out_dir = os.path.join(work, c["name"], f"out_{c['batch']}_{system}")
            os.makedirs(out_dir)
            if system == "kiln":
                reply = kiln_load(kiln, c, out_dir, timeout)
            else:
                reply = workers[system].call(cmd="load", key=c["key"], model=c["model"], state=c["state"],
                                             onnx=c["onnx"], inputs=c["inputs"], output_names=c["output_names"],
                                             output_dir=out_dir)
            if reply["ok"]:
                outputs[system] = read_outputs(out_dir)
            else:
                c["failed"][system] = reply["error"]
        if "torch" in outputs:
            for system in ("kiln", "ort"):
                if system in outputs:
                    worst, problem = compare(outputs[system], outputs["torch"])
                    if problem:
                        c["failed"][system] = f"does not match PyTorch: {problem}"
                    else:
                        c.setdefault("agreement", {})[system] = worst
        status = ", ".join(f"{s} FAILED ({e})" for s, e in c["failed"].items()) or "all agree"
        print(f"[check] {c['key']}: {status}", file=sys.stderr, flush=True)


def check_training(train_configs, workers, train_bench, timeout=None):
    """Training agreement: the losses of the first steps from the same weights and batch (each step's loss
    depends on every earlier step's gradients and update)."""
    for c in train_configs:
        kiln_reply = kiln_train(train_bench, c, TRAIN_CHECK_STEPS, 0, timeout)
        torch_reply = workers["torch"].call(cmd="train_load", key=c["key"], model=c["model"], state=c["state"],
                                            optimizer=c["optimizer"], inputs=c["inputs"], labels=c["labels"],
                                            steps=TRAIN_CHECK_STEPS)
        for system, reply in (("kiln", kiln_reply), ("torch", torch_reply)):
            if not reply["ok"]:
                c["failed"][system] = reply["error"]
        if kiln_reply["ok"] and torch_reply["ok"]:
            got, want = np.array(kiln_reply["losses"]), np.array(torch_reply["losses"])
            c["losses"] = (got, want)
            drop_got, drop_want = got[0] - got[1:], want[0] - want[1:]
            rtol = c.get("loss_rtol") or (TRAIN_LOSS_RTOL_ADAMW if c["optimizer"] == "adamw" else TRAIN_LOSS_RTOL)
            if not np.allclose(got, want, rtol=rtol, atol=0) or not np.allclose(
                    drop_got, drop_want, rtol=TRAIN_DROP_RTOL, atol=1e-6):
                c["failed"]["kiln"] = f"losses {got.tolist()} do not match PyTorch's {want.tolist()}"
        status = ", ".join(f"{s} FAILED ({e})" for s, e in c["failed"].items()) or (
            f"losses agree ({' '.join(f'{v:.4f}' for v in c['losses'][1])})")
        print(f"[check] {c['key']}: {status}", file=sys.stderr, flush=True)


def time_rounds(configs, train_configs, workers, kiln, train_bench, args, started, timeout=None):
    """Times in args.rounds rounds: each round runs every system once per configuration (args.warmup warm-up runs,
    then args.runs timed ones, after args.pause seconds idle) and appends its median to the configuration's
    "rounds"; a system that fails is recorded in "failed" and not run again."""
    for r in range(args.rounds):
        for c in configs:
            for system in SYSTEMS:
                if system in c["failed"]:
                    continue
                # The previous system's idle threads may still spin (OpenMP, ONNX Runtime's pool) and would
                # take the cores from this one.
                time.sleep(args.pause)
                take_turn(c, system, workers, lambda: kiln_bench(kiln, c, args.runs, args.warmup, timeout), args)
        for c in train_configs:
            for system in TRAIN_SYSTEMS:
                if system in c["failed"]:
                    continue
                time.sleep(args.pause)
                take_turn(c, system, workers, lambda: kiln_train(train_bench, c, args.runs, args.warmup, timeout),
                          args)
        print(f"[bench] round {r + 1}/{args.rounds} done ({time.time() - started:.0f} s)", file=sys.stderr,
              flush=True)


def machine_description():
    lines = []
    try:
        info = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        fields = dict(re.findall(r"^([^:\n]+):\s*(.*)$", info, re.M))
        flags = fields.get("Flags", "").split()
        lines.append(f"- CPU: {fields.get('Model name', '?')}, {fields.get('CPU(s)', '?')} CPUs "
                     f"({fields.get('Thread(s) per core', '?')} thread(s) per core), "
                     f"L2 {fields.get('L2 cache', '?')}, L3 {fields.get('L3 cache', '?')}")
        simd = [f for f in flags if f.startswith("avx512") or f in ("avx2", "fma", "amx_tile", "avx_vnni")]
        lines.append(f"- SIMD flags: {' '.join(simd) if simd else 'none of avx2/avx512'}")
    except OSError:
        lines.append("- CPU: lscpu not available")
    lines.append(f"- OS: {platform.platform()}")
    return lines


def versions(kiln, torch_version=None):
    """The report's lines on what ran; TORCH_VERSION (the torch worker's system_version) where the worker runs
    another Python than this one."""
    import torch
    # The training tables need no ONNX Runtime (scripts/install-bench-deps installs it for inference).
    ort_version = importlib.util.find_spec("onnxruntime") and __import__("onnxruntime").__version__
    commit = subprocess.run(["git", "-C", ROOT, "log", "-1", "--format=%h (%cs)"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True).stdout.strip()
    # oneDNN from PyPI in .deps/onednn (scripts/install-deps): its version header.
    try:
        with open(os.path.join(ROOT, ".deps", "onednn", "include", "oneapi", "dnnl", "dnnl_version.h")) as f:
            v = dict(re.findall(r"#define DNNL_VERSION_(MAJOR|MINOR|PATCH) (\d+)", f.read()))
        dnnl = f"{v['MAJOR']}.{v['MINOR']}.{v['PATCH']}"
    except (OSError, KeyError):
        dnnl = "not installed"
    blas = os.path.realpath("/usr/lib/x86_64-linux-gnu/libblas.so.3")
    policy = KILN_ENV.get("OMP_WAIT_POLICY", "unset")
    return [f"- Kiln (OMP_WAIT_POLICY {policy}): {os.path.relpath(kiln, ROOT) if kiln.startswith(ROOT + os.sep) else kiln}, commit {commit}{' (with uncommitted changes)' if dirty else ''}",
            f"- {torch_version or f'PyTorch {torch.__version__} (libblas.so.3 -> {blas})'}, "
            "OPENBLAS_CORETYPE=SkylakeX, OMP_NUM_THREADS=2, OMP_WAIT_POLICY=PASSIVE",
            f"- ONNX Runtime {ort_version or 'not installed'}", f"- oneDNN (PyPI onednn-cpu-gomp) {dnnl}",
            f"- Python {platform.python_version()}, NumPy {np.__version__}"]


def geomean(values):
    values = [v for v in values if v is not None and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def fmt(v, digits=3):
    return "fail" if v is None else f"{v:.{digits}f}"


def fmt_ms(v):
    return "fail" if v is None else (f"{v:.4f}" if v < 1 else f"{v:.3f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kiln", default=os.path.join(ROOT, "build", "tools", "kiln"), help="the kiln binary")
    parser.add_argument("--rounds", type=int, default=8, help="timing rounds (default 8)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per system and configuration in each round")
    parser.add_argument("--warmup", type=int, default=3, help="warm-up runs before each round's timed runs")
    parser.add_argument("--pause", type=float, default=0.2,
                        help="seconds of idle time before each system's runs (default 0.2)")
    parser.add_argument("--kiln-omp-passive", action="store_true",
                        help="run Kiln with OMP_WAIT_POLICY=PASSIVE too (its kernels run on OpenMP; see README.md)")
    parser.add_argument("--models", default=",".join(m[1] for m in MODELS), help="comma-separated subset")
    parser.add_argument("--batches", default="", help="comma-separated batch sizes instead of 1 and each model's large one")
    parser.add_argument("--tables", default="inference,training",
                        help="which tables: inference (kiln run, PyTorch, ORT), training (training steps, Kiln and "
                        "PyTorch); default both")
    parser.add_argument("--optimizers", default="sgd",
                        help="training rows' optimizers: sgd (momentum 0.9), adamw; comma-separated (default sgd)")
    parser.add_argument("--kiln-train-bench", help="the kiln-train-bench binary (default: beside --kiln's build)")
    parser.add_argument("--output", help="also write the report to this file")
    parser.add_argument("--worker", choices=("torch", "ort"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker_main(args.worker)
    if args.rounds * args.runs < 20:
        parser.error(f"--rounds x --runs is {args.rounds * args.runs}: at least 20 timed runs are required")
    kiln = os.path.abspath(args.kiln)
    train_bench = os.path.abspath(args.kiln_train_bench or os.path.join(os.path.dirname(kiln), "kiln-train-bench"))
    tables = args.tables.split(",")
    optimizers = args.optimizers.split(",")
    if set(tables) - {"inference", "training"}:
        parser.error(f"--tables {args.tables}: expected inference, training or both")
    if set(optimizers) - {"sgd", "adamw"}:
        parser.error(f"--optimizers {args.optimizers}: expected sgd, adamw or both")
    if "training" in tables and not os.access(train_bench, os.X_OK):
        parser.error(f"no kiln-train-bench binary at {train_bench}: build the repository or pass --kiln-train-bench")
    if args.kiln_omp_passive:
        KILN_ENV["OMP_WAIT_POLICY"] = "PASSIVE"
    if not os.access(kiln, os.X_OK):
        parser.error(f"no kiln binary at {kiln}: build the repository or pass --kiln PATH")
    wanted = args.models.split(",")
    known = [m[1] for m in MODELS]
    unknown = set(wanted) - set(known)
    if unknown:
        parser.error(f"unknown models {sorted(unknown)}; known: {', '.join(known)}")

    import torch
    started = time.time()
    load_before = os.getloadavg()
    export = load_export_module()
    models = e2e_models(export)
    work = tempfile.mkdtemp(prefix="kiln-bench-")
    exported = {}

    def export_model(source, name):
        """The model's ONNX file (dynamic batch) and PyTorch weights, once per model."""
        if source in exported:
            return exported[source]
        module, example, output_names, axes = models[source]
        folder = os.path.join(work, name)
        os.makedirs(folder)
        onnx_path = os.path.join(folder, "model.onnx")
        module.eval()
        # Outside no_grad, as the export script does: under it, the Transformer takes PyTorch's fused fast path,
        # which has no ONNX export.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the RNN exports warn about batch sizes other than 1
            torch.onnx.export(module, tuple(example.values()), onnx_path, input_names=list(example),
                              output_names=output_names, dynamic_axes=axes, opset_version=export.OPSET,
                              do_constant_folding=True)
        state = os.path.join(folder, "state.pt")
        torch.save(module.state_dict(), state)
        exported[source] = (folder, onnx_path, state)
        return exported[source]

    configs = []
    for source, name, large in MODELS if "inference" in tables else []:
        if name not in wanted:
            continue
        module, example, output_names, axes = models[source]
        folder, onnx_path, state = export_model(source, name)
        batches = [int(b) for b in args.batches.split(",")] if args.batches else [1, large]
        for batch in batches:
            inputs = {}
            for input_name, value in batch_inputs(example, axes, batch, seed=batch).items():
                inputs[input_name] = os.path.join(folder, f"b{batch}_{input_name}.npy")
                np.save(inputs[input_name], value)
            configs.append({"key": f"{name}/{batch}", "model": source, "name": name, "batch": batch, "onnx": onnx_path,
                            "state": state, "inputs": inputs, "output_names": output_names, "failed": {},
                            "rounds": {s: [] for s in SYSTEMS}})
    train_configs = []
    for source, name, batch in TRAIN_MODELS if "training" in tables else []:
        if name not in wanted:
            continue
        module, example, _, axes = models[source]
        folder, onnx_path, state = export_model(source, name)
        module.load_state_dict(torch.load(state))
        batch_values, labels = train_batch(module, example, axes, batch, seed=1000 + batch)
        inputs = {}
        for input_name, value in batch_values.items():
            inputs[input_name] = os.path.join(folder, f"train{batch}_{input_name}.npy")
            np.save(inputs[input_name], value)
        labels_path = os.path.join(folder, f"train{batch}_labels.npy")
        np.save(labels_path, labels)
        for optimizer in optimizers:
            train_configs.append({"key": f"train/{name}/{batch}/{optimizer}", "model": source, "name": name,
                                  "batch": batch, "optimizer": optimizer, "onnx": onnx_path, "state": state,
                                  "inputs": inputs, "labels": labels_path, "failed": {},
                                  "rounds": {s: [] for s in TRAIN_SYSTEMS}})

    workers = {"torch": Worker("torch", torch_env())}
    if configs:
        workers["ort"] = Worker("ort", ort_env())
    try:
        check_inference(configs, workers, kiln, work)
        check_training(train_configs, workers, train_bench)
        time_rounds(configs, train_configs, workers, kiln, train_bench, args, started)
    finally:
        for w in workers.values():
            w.close()

    lines = [f"Measured {datetime.datetime.now().strftime('%Y-%m-%d %H:%M %Z').strip()} by bench/run.py "
             f"({args.rounds} rounds x {args.runs} timed runs after {args.warmup} warm-up runs per system and "
             f"configuration; the time is the median of the round medians; 2 threads each).", ""]
    load_after = os.getloadavg()
    lines += machine_description()
    lines.append(f"- Load average (1 min) {load_before[0]:.1f} before the run, {load_after[0]:.1f} after: other "
                 "processes on the machine take cores from all three systems, and 2-thread OpenMP runs suffer most")
    lines += versions(kiln) + [""]
    notes = []
    if configs:
        lines.append("| model | batch | Kiln ms | PyTorch ms | ORT ms | Kiln/PyTorch | Kiln/ORT |")
        lines.append("|---|---:|---:|---:|---:|---:|---:|")
        ratios_torch, ratios_ort = [], []
        for c in configs:
            ms = {s: (statistics.median(c["rounds"][s]) if s not in c["failed"] and c["rounds"][s] else None)
                  for s in SYSTEMS}
            vs_torch = ms["kiln"] / ms["torch"] if ms["kiln"] and ms["torch"] else None
            vs_ort = ms["kiln"] / ms["ort"] if ms["kiln"] and ms["ort"] else None
            ratios_torch.append(vs_torch)
            ratios_ort.append(vs_ort)
            lines.append(f"| {c['name']} | {c['batch']} | {fmt_ms(ms['kiln'])} | {fmt_ms(ms['torch'])} | "
                         f"{fmt_ms(ms['ort'])} | {fmt(vs_torch, 2)} | {fmt(vs_ort, 2)} |")
            for system, error in c["failed"].items():
                notes.append(f"- {c['key']}: {system} failed: {error}")
        complete = [(a, b) for a, b in zip(ratios_torch, ratios_ort) if a and b]
        g_torch, g_ort = geomean([a for a, _ in complete]), geomean([b for _, b in complete])
        lines.append(f"| **geometric mean** | | | | | **{fmt(g_torch, 2)}** | **{fmt(g_ort, 2)}** |")
        lines.append("")
        lines.append(f"Ratios below 1 mean Kiln is faster. Geometric means over the {len(complete)} of "
                     f"{len(configs)} configurations where every system ran.")
    if train_configs:
        if configs:
            lines.append("")
        lines.append("Training step (forward, cross-entropy, backward, optimizer update; Kiln: kiln-train-bench, "
                     f"one compiled step function; PyTorch: eager autograd and torch.optim; lr {TRAIN_LR}):")
        lines.append("")
        lines.append("| model | batch | optimizer | Kiln ms | PyTorch ms | Kiln/PyTorch | first losses (PyTorch) |")
        lines.append("|---|---:|---|---:|---:|---:|---|")
        ratios = []
        for c in train_configs:
            ms = {s: (statistics.median(c["rounds"][s]) if s not in c["failed"] and c["rounds"][s] else None)
                  for s in TRAIN_SYSTEMS}
            ratio = ms["kiln"] / ms["torch"] if ms["kiln"] and ms["torch"] else None
            ratios.append(ratio)
            losses = " ".join(f"{v:.4f}" for v in c["losses"][1]) if "losses" in c else ""
            label = {"sgd": "SGD momentum 0.9", "adamw": "AdamW"}[c["optimizer"]]
            lines.append(f"| {c['name']} | {c['batch']} | {label} | {fmt_ms(ms['kiln'])} | {fmt_ms(ms['torch'])} | "
                         f"{fmt(ratio, 2)} | {losses} |")
            for system, error in c["failed"].items():
                notes.append(f"- {c['key']}: {system} failed: {error}")
        done = [r for r in ratios if r]
        lines.append(f"| **geometric mean** | | | | | **{fmt(geomean(done), 2)}** | |")
        lines.append("")
        lines.append(f"Ratios below 1 mean Kiln is faster; geometric mean over the {len(done)} of "
                     f"{len(train_configs)} configurations where both ran. Kiln's and PyTorch's losses agreed over "
                     f"the first {TRAIN_CHECK_STEPS} steps (rtol {TRAIN_LOSS_RTOL}, AdamW {TRAIN_LOSS_RTOL_ADAMW}, and their drop from the first step's loss "
                     f"to rtol {TRAIN_DROP_RTOL}) before timing; a configuration "
                     "where they did not is listed under Failures and not timed.")
    if notes:
        lines += ["", "Failures:"] + notes
    report = "\n".join(lines) + "\n"
    print(report)
    if args.output:
        with open(args.output, "w") as f:
            f.write(report)
    shutil.rmtree(work, ignore_errors=True)
    print(f"[bench] total {time.time() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
