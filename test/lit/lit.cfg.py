# lit configuration for Kiln's regression tests.
import os
import lit.formats

config.name = "Kiln"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".kir", ".test"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(os.path.dirname(config.kiln_tools_dir), "test", "lit-out")
config.excludes = ["Inputs", "lit.cfg.py", "lit.site.cfg.py.in"]

# Kiln's tools first (and test helpers such as kiln-kc-retarget), then
# LLVM's FileCheck and not.
config.environment["PATH"] = os.pathsep.join(
    [config.kiln_tools_dir, config.kiln_test_tools_dir, os.path.dirname(config.filecheck),
     config.environment.get("PATH", "")])

# `kiln` never uses the user's kernel cache in tests.
config.environment["KILN_CACHE_DIR"] = os.path.join(config.test_exec_root, "kernel-cache")

# %python runs helper scripts; %kiln_src is the source tree.
import sys
config.substitutions.append(("%python", sys.executable))
config.substitutions.append(("%kiln_src", config.kiln_source_dir))
# %numpy_python is Debian's python3, with the NumPy and ONNX that
# scripts/install-deps installs (%python may be another interpreter), for
# fixtures written at test time.
config.substitutions.append(("%numpy_python", "/usr/bin/python3"))

# %fake_cuda is the fake CUDA driver of test/devices/fake-driver (a
# libcuda.so.1 whose behaviour $KILN_FAKE_CUDA chooses),
# %fake_cuda_incomplete a copy lacking an entry point; tests name them with KILN_CUDA_DRIVER. A test of the real
# machine's driver state REQUIRES no-cuda-driver (or cuda-driver).
config.substitutions.append(("%fake_cuda_incomplete", config.fake_cuda_driver_incomplete))
# %cuda_emulator is Kiln's emulated GPU (test/devices/emulator/): a driver
# that runs the PTX Kiln hands it, for tests that run models on CUDA.
config.substitutions.append(("%cuda_emulator", config.cuda_emulator_driver))
config.substitutions.append(("%fake_cuda", config.fake_cuda_driver))
import ctypes
try:
    ctypes.CDLL("libcuda.so.1")
    config.available_features.add("cuda-driver")
except OSError:
    config.available_features.add("no-cuda-driver")

# The instrumented build (scripts/test --sanitize, KILN_SANITIZE): a test
# that cannot run under AddressSanitizer says `UNSUPPORTED: asan`, and why.
if config.kiln_sanitize.upper() in ("ON", "TRUE", "YES", "1"):
    config.available_features.add("asan")
