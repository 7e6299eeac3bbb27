#!/usr/bin/python3
"""A rank that dies or hangs ends a data-parallel job with Kiln's message.

    dp-failures.py KILN OUT_DIR FAKE_CUDA_DRIVER

Starts `mpirun -np 2 kiln train` on a long run, waits until both ranks
train, then
  - kills rank 1 (SIGKILL): mpirun ends the job; rank 0 says at which step
    it was stopped;
  - stops rank 1 (SIGSTOP) in a job with --collective-timeout 3: rank 0's
    next collective misses its deadline, and it names the collective, the
    step and its rank, and ends the job (MPI_Abort).
Each job must end within 60 s with a non-zero exit status. And a job whose
ranks were started with different options is refused before training, as is
a job of 3 ranks with --device cuda on a machine of 2 GPUs (the fake driver
of test/devices/fake-driver playing two H100s): NCCL refuses two ranks on one GPU.
"""
import os
import signal
import subprocess
import sys
import time

import numpy as np

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2"]
MPI_ENV = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none", OMPI_MCA_rmaps_base_oversubscribe="1")
MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e", "mlp", "model.onnx")


def ranks_of(mpirun_pid):
    """The job's kiln processes by rank (children of mpirun, read from /proc)."""
    ranks = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != mpirun_pid:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            ranks[int(env[b"OMPI_COMM_WORLD_RANK"])] = int(pid)
        except (OSError, KeyError, ValueError, IndexError):
            continue
    return ranks


def run_and_break(kiln, npz, sig, extra):
    log = open(os.path.join(os.path.dirname(npz), f"job-{sig.name}.log"), "w+")
    job = subprocess.Popen(MPIRUN + [kiln, "train", MODEL, "--data", npz, "--lr", "0.01", "--batch-size", "16",
                                     "--steps", "100000000", "--threads", "1"] + extra,
                           stdout=log, stderr=subprocess.STDOUT, env=MPI_ENV)
    victim = None
    try:
        deadline = time.time() + 60
        while time.time() < deadline:
            ranks = ranks_of(job.pid)
            log.flush()
            with open(log.name) as f:
                started = "step " in f.read()
            if len(ranks) == 2 and started:
                victim = ranks[1]
                break
            if job.poll() is not None:
                break
            time.sleep(0.2)
        if victim is None:
            raise SystemExit(f"the job did not start training:\n{open(log.name).read()}")
        os.kill(victim, sig)
        start = time.time()
        rc = job.wait(timeout=60)
        return rc, time.time() - start, open(log.name).read()
    finally:
        if job.poll() is None:
            job.kill()
        if victim is not None:
            for s in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(victim, s)
                except ProcessLookupError:
                    pass


def main():
    kiln, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)
    npz = os.path.join(out, "data.npz")
    np.savez(npz, x=rng.standard_normal((256, 64)).astype(np.float32), y=rng.integers(0, 10, 256))

    # Ranks started with other options than rank 0's are refused before training.
    base = [kiln, "train", MODEL, "--data", npz, "--batch-size", "16", "--steps", "5", "--threads", "1"]
    mixed = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1"] + base + ["--lr", "0.01",
                            ":", "-np", "1"] + base + ["--lr", "0.02"],
                           capture_output=True, text=True, env=MPI_ENV, timeout=120)
    refusal = "rank 1 was started with another set of options than rank 0"
    if mixed.returncode == 0 or refusal not in mixed.stderr:
        raise SystemExit(f"ranks with other options: expected the refusal, got {mixed.returncode}:\n{mixed.stderr}")
    print("ranks with other options: refused with: " + next(l for l in mixed.stderr.splitlines() if refusal in l))

    # More ranks on a machine than GPUs.
    crowded = subprocess.run(["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "3", "-x", "KILN_CUDA_DRIVER",
                              "-x", "KILN_FAKE_CUDA"] + base + ["--lr", "0.01", "--device", "cuda"],
                             capture_output=True, text=True, timeout=120,
                             env=dict(MPI_ENV, KILN_CUDA_DRIVER=sys.argv[3], KILN_FAKE_CUDA="2xh100"))
    refusal = "3 ranks run on this machine but it has 2 usable GPUs: NCCL refuses two ranks on one GPU"
    if crowded.returncode == 0 or refusal not in crowded.stderr:
        raise SystemExit(f"3 ranks on 2 GPUs: expected the refusal, got {crowded.returncode}:\n{crowded.stderr}")
    print("3 ranks on 2 GPUs: refused with: " + next(l for l in crowded.stderr.splitlines() if refusal in l))

    rc, seconds, text = run_and_break(kiln, npz, signal.SIGKILL, ["--log-every", "1000"])
    if rc == 0 or "kiln train: rank 0 of 2: stopped at step" not in text:
        raise SystemExit(f"a killed rank: expected the job to fail with rank 0's message, got {rc}:\n{text[-3000:]}")
    print(f"killed rank 1: the job ended in {seconds:.1f} s with: "
          + next(line for line in text.splitlines() if "rank 0 of 2: stopped" in line))

    rc, seconds, text = run_and_break(kiln, npz, signal.SIGSTOP, ["--log-every", "1000", "--collective-timeout", "3"])
    expected = "did not complete within 3 s (--collective-timeout): another rank stopped, died or hangs"
    if rc == 0 or "kiln train: error: rank 0 of 2: step " not in text or expected not in text:
        raise SystemExit(f"a stopped rank: expected rank 0's timeout, got {rc}:\n{text[-3000:]}")
    print(f"stopped rank 1: the job ended in {seconds:.1f} s with: "
          + next(line for line in text.splitlines() if expected in line))


if __name__ == "__main__":
    main()
