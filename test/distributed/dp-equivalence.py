#!/usr/bin/python3
"""Data-parallel training equals one process with the global batch.

    dp-equivalence.py KILN MODEL_NAME OUT_DIR [CUDA_EMULATOR]

Trains MODEL_NAME (mlp, cnn or gpt: test/e2e/<model>/model.onnx, dynamic
batch) for 10 SGD steps (momentum 0.9, shuffled) twice: one process with
batch 8, and `mpirun -np 2` with batch 4 per rank. Each rank takes its
DistributedSampler shard of the same shuffled order, so the two runs see the
same samples at every step, and every trained weight must agree within
rtol 1e-5 (up to the order of the sums). Only rank 0 may report.

With CUDA_EMULATOR (the emulated GPU's libcuda.so.1), the 2 ranks train
with --device cuda, each on its own emulated GPU, their gradients
all-reduced by NCCL (the emulator's, between the processes), against the
same one CPU process.
"""
import os
import subprocess
import sys

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
E2E = os.path.join(HERE, "..", "e2e")

# Open MPI in containers: run as root, more ranks than cores, and no
# cross-memory attach (docs/distributed.md).
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
MPI_ENV = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")


def data(model, rng):
    if model == "mlp":
        # A third of the labels are -100, cross-entropy's ignored label: the
        # ranks' batches hold different numbers of them, and the job's loss is
        # still the mean over the non-ignored labels of the global batch.
        y = rng.integers(0, 10, 48)
        y[rng.random(48) < 0.33] = -100
        return rng.standard_normal((48, 64)).astype(np.float32), y, []
    if model == "cnn":
        return rng.standard_normal((16, 3, 28, 28)).astype(np.float32), rng.integers(0, 10, 16), []
    if model == "gpt":
        tokens = rng.integers(0, 64, (24, 9))
        return tokens[:, :8].astype(np.int64), tokens[:, 1:].astype(np.int64), ["--classes-last"]
    raise SystemExit(f"unknown model {model}")


def weights(path):
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def main():
    kiln, model, out = sys.argv[1], sys.argv[2], sys.argv[3]
    emulator = sys.argv[4] if len(sys.argv) > 4 else None
    os.makedirs(out, exist_ok=True)
    x, y, extra = data(model, np.random.default_rng(7))
    npz = os.path.join(out, "data.npz")
    np.savez(npz, x=x, y=y)
    source = os.path.join(E2E, "gpt-dynamic" if model == "gpt" else model, "model.onnx")
    common = [source, "--data", npz, "--lr", "0.05", "--momentum", "0.9", "--steps", "10", "--seed", "3",
              "--threads", "1"] + extra
    one_path, two_path = os.path.join(out, "one.onnx"), os.path.join(out, "two.onnx")
    one = subprocess.run([kiln, "train"] + common + ["--batch-size", "8", "-o", one_path],
                         capture_output=True, text=True)
    if one.returncode != 0:
        raise SystemExit(f"one process failed:\n{one.stdout}{one.stderr}")
    if emulator:
        launch = MPIRUN + ["-x", "KILN_CUDA_DRIVER"]
        two = subprocess.run(launch + [kiln, "train"] + common + ["--batch-size", "4", "--device", "cuda", "-o", two_path],
                             capture_output=True, text=True, env=dict(MPI_ENV, KILN_CUDA_DRIVER=emulator), timeout=900)
        if "NCCL" not in two.stderr:
            raise SystemExit(f"the CUDA job did not use NCCL:\n{two.stderr}")
    else:
        two = subprocess.run(MPIRUN + [kiln, "train"] + common + ["--batch-size", "4", "-o", two_path],
                             capture_output=True, text=True, env=MPI_ENV, timeout=600)
    if two.returncode != 0:
        raise SystemExit(f"mpirun -np 2 failed:\n{two.stdout}{two.stderr}")
    if "data-parallel over 2 ranks" not in two.stderr:
        raise SystemExit(f"the job did not run data-parallel:\n{two.stderr}")
    if two.stdout.count("trained 10 steps (80 samples)") != 1:
        raise SystemExit(f"rank 0 alone reports the job's 80 samples:\n{two.stdout}")
    a, b = weights(one_path), weights(two_path)
    initial = weights(source)
    worst = 0.0
    for name, value in a.items():
        if not np.issubdtype(value.dtype, np.floating):
            if not np.array_equal(b[name], value):
                raise SystemExit(f"{model}: constant {name} differs")
            continue
        if not np.allclose(b[name], value, rtol=1e-5, atol=1e-6):
            raise SystemExit(f"{model}: weight {name} differs: max |2 ranks - 1 process| = "
                             f"{np.abs(b[name] - value).max():.3g}")
        worst = max(worst, float(np.abs(b[name] - value).max()))
    moved = max(float(np.abs(a[n] - initial[n]).max()) for n in a
                if n in initial and np.issubdtype(a[n].dtype, np.floating))
    if moved < 1e-4:
        raise SystemExit(f"{model}: training did not move the weights (largest change {moved:.3g})")
    where = " (2 emulated GPUs, NCCL)" if emulator else ""
    print(f"{model}: 2 ranks x batch 4{where} = 1 process x batch 8 after 10 steps: {len(a)} weights, "
          f"largest difference {worst:.3g} (the weights moved by up to {moved:.3g})")
    if model == "mlp" and not emulator:
        # --resume on every rank: 5 steps with a checkpoint, then 5 more from it, equal the 10 in one go.
        ckpt = os.path.join(out, "checkpoints")
        first = subprocess.run(MPIRUN + [kiln, "train"] + common + ["--batch-size", "4", "--checkpoint-every", "5",
                                                                    "--checkpoint-dir", ckpt],
                               capture_output=True, text=True, env=MPI_ENV, timeout=600)
        resumed_path = os.path.join(out, "resumed.onnx")
        resumed = subprocess.run(MPIRUN + [kiln, "train"] + common + ["--batch-size", "4", "--resume",
                                                                      os.path.join(ckpt, "step-5.npz"), "-o",
                                                                      resumed_path],
                                 capture_output=True, text=True, env=MPI_ENV, timeout=600)
        if first.returncode != 0 or resumed.returncode != 0:
            raise SystemExit(f"the resumed job failed:\n{first.stderr}{resumed.stdout}{resumed.stderr}")
        c = weights(resumed_path)
        for name, value in b.items():
            if not np.array_equal(c[name], value):
                raise SystemExit(f"resumed at step 5: weight {name} differs from the straight run")
        print("mlp: resumed at step 5 on both ranks: the same weights as the straight run")


if __name__ == "__main__":
    main()
