#!/usr/bin/python3
"""`mpirun -np 2 kiln train` on the digits example reaches the accuracy of
one process with the same global batch.

    dp-digits.py KILN OUT_DIR

The example's CNN and options (examples/digits/train-digits.sh) for 20
epochs: one process with batch 64, then 2 ranks with batch 32 each. Both
must reach at least 95% held-out accuracy and agree within 0.5 points (the
runs differ only in the order of the gradient sums).
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DIGITS = os.path.join(HERE, "..", "..", "examples", "digits")
MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
MPI_ENV = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")


def accuracy(stdout):
    found = re.findall(r"accuracy ([0-9.]+)", stdout)
    if not found:
        raise SystemExit(f"no accuracy printed:\n{stdout}")
    return float(found[-1])


def main():
    kiln, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    if not os.path.exists(os.path.join(out, "train.npz")):
        subprocess.run(["/usr/bin/python3", os.path.join(DIGITS, "make-digits.py"), out], check=True,
                       stdout=subprocess.DEVNULL)
    args = [os.path.join(DIGITS, "cnn.onnx"), "--data", os.path.join(out, "train.npz"), "--eval",
            os.path.join(out, "test.npz"), "--loss", "cross_entropy", "--optimizer", "sgd", "--lr", "0.05",
            "--momentum", "0.9", "--epochs", "20", "--seed", "0", "--threads", "1"]
    one = subprocess.run([kiln, "train"] + args + ["--batch-size", "64"], capture_output=True, text=True)
    if one.returncode != 0:
        raise SystemExit(f"one process failed:\n{one.stdout}{one.stderr[-3000:]}")
    two = subprocess.run(MPIRUN + [kiln, "train"] + args + ["--batch-size", "32"], capture_output=True, text=True,
                         env=MPI_ENV, timeout=900)
    if two.returncode != 0:
        raise SystemExit(f"mpirun -np 2 failed:\n{two.stdout}{two.stderr[-3000:]}")
    a, b = accuracy(one.stdout), accuracy(two.stdout)
    print(f"digits, 20 epochs: 1 process x batch 64: accuracy {a:.4f}; 2 ranks x batch 32: accuracy {b:.4f}")
    if min(a, b) < 0.95 or abs(a - b) > 0.005:
        raise SystemExit("expected both at least 0.95 and within 0.005 of each other")


if __name__ == "__main__":
    main()
