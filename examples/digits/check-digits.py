#!/usr/bin/env python3
"""The digits ctest: runs examples/digits/train-digits.sh (data made into
OUT_DIR on first use, then `kiln train` with --eval) and checks what it
prints: the held-out accuracy of the last evaluation must be at least
MIN_ACCURACY, and a 10x10 confusion matrix must follow, whose entries sum
to the test set's size and whose diagonal agrees with that accuracy; and
the trained model written by -o, run by `kiln run` on the test set, must
reach the same accuracy.

    check-digits.py KILN OUT_DIR [MIN_ACCURACY]    (default 0.95)
"""
import os
import re
import subprocess
import sys
import time

import numpy as np

kiln, out_dir = sys.argv[1], sys.argv[2]
min_accuracy = float(sys.argv[3]) if len(sys.argv) > 3 else 0.95
here = os.path.dirname(os.path.abspath(__file__))

start = time.monotonic()
run = subprocess.run([os.path.join(here, "train-digits.sh"), out_dir], env=dict(os.environ, KILN=kiln),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
seconds = time.monotonic() - start
sys.stdout.write(run.stdout)
sys.stderr.write(run.stderr[-4000:])
if run.returncode != 0:
    sys.exit(f"check-digits: train-digits.sh exited with {run.returncode}")

test_size = len(np.load(os.path.join(out_dir, "test.npz"))["y"])
accuracies = re.findall(r"accuracy ([0-9.]+)", run.stdout)
if not accuracies:
    sys.exit("check-digits: kiln train printed no 'accuracy X' line")
accuracy = float(accuracies[-1])

lines = run.stdout.splitlines()
heads = [i for i, line in enumerate(lines) if line.startswith("confusion matrix")]
if not heads:
    sys.exit("check-digits: kiln train printed no confusion matrix")
# After the title, a header row of the predicted classes 0..9, then one row
# per true class: its class, then ten counts.
header = lines[heads[-1] + 1].split()
if header[-10:] != [str(c) for c in range(10)]:
    sys.exit(f"check-digits: confusion matrix header is {header}, expected the classes 0..9")
rows = []
for line in lines[heads[-1] + 2:heads[-1] + 12]:
    fields = line.split()
    if len(fields) != 11 or not all(f.isdigit() for f in fields) or int(fields[0]) != len(rows):
        sys.exit(f"check-digits: confusion matrix row {len(rows)} is '{line}', expected the class and 10 counts")
    rows.append([int(f) for f in fields[1:]])
matrix = np.array(rows)
if matrix.sum() != test_size:
    sys.exit(f"check-digits: the confusion matrix sums to {matrix.sum()}, expected the {test_size} test samples")
if abs(np.trace(matrix) / test_size - accuracy) > 1e-4:
    sys.exit(f"check-digits: the matrix's diagonal gives accuracy {np.trace(matrix) / test_size:.4f}, "
             f"the printed one is {accuracy:.4f}")
if accuracy < min_accuracy:
    sys.exit(f"check-digits: held-out accuracy {accuracy:.4f}, expected at least {min_accuracy}")

# The trained model kiln train wrote (-o) classifies the test set as well
# when `kiln run` runs it (one sample of slack: its batch differs from the
# evaluation's, which may round a near tie the other way).
test = np.load(os.path.join(out_dir, "test.npz"))
x_path = os.path.join(out_dir, "test-x.npy")
np.save(x_path, test["x"])
run_dir = os.path.join(out_dir, "kiln-run")
subprocess.run([kiln, "run", os.path.join(out_dir, "cnn-trained.onnx"), "--input", f"x={x_path}", "--output-dir",
                run_dir], check=True, stdout=subprocess.DEVNULL)
predicted = np.load(os.path.join(run_dir, "logits.npy")).argmax(axis=1)
run_accuracy = float((predicted == test["y"]).mean())
if abs(run_accuracy - accuracy) > 1.5 / test_size:
    sys.exit(f"check-digits: kiln run of the trained model gives accuracy {run_accuracy:.4f}, "
             f"kiln train printed {accuracy:.4f}")
print(f"check-digits: held-out accuracy {accuracy:.4f} >= {min_accuracy} (kiln run of the trained model: "
      f"{run_accuracy:.4f}), confusion matrix of {test_size} samples, {seconds:.1f} s")
