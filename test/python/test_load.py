"""kiln.load: ports, NumPy and torch inputs, errors, .kc files, outputs, threads, leaks."""
import gc
import json
import os
import resource
import subprocess
import sys
import threading
import warnings

import numpy as np
import pytest
import torch

import kiln


def mlp(e2e_dir):
    return kiln.load(e2e_dir / "mlp" / "model.onnx")


def test_ports_name_dtype_and_symbolic_dims(e2e_dir):
    m = kiln.load(e2e_dir / "cnn" / "model.onnx")
    assert m.inputs == [kiln.Port("x", "float32", ("batch", 3, 28, 28), False)]
    assert [o.name for o in m.outputs] == ["logits"]
    assert m.outputs[0].dtype == "float32"
    assert m.outputs[0].shape[1] == 10
    assert m.device == "cpu"


@pytest.mark.parametrize("model", ["mlp", "cnn", "lstm", "gpt-dynamic", "resnetish"])
def test_numpy_in_numpy_out_matches_pytorch(e2e_dir, model):
    folder = e2e_dir / model
    m = kiln.load(folder / "model.onnx")
    inputs = {p.name: np.load(folder / f"input_{p.name}.npy") for p in m.inputs}
    out = m(**inputs)
    out = out if isinstance(out, tuple) else (out,)
    assert len(out) == len(m.outputs)
    for port, value in zip(m.outputs, out):
        expected = np.load(folder / f"expected_{port.name}.npy")
        assert isinstance(value, np.ndarray)
        assert value.dtype == expected.dtype and value.shape == expected.shape
        np.testing.assert_allclose(value, expected, rtol=1e-4, atol=1e-5)


def test_positional_named_and_torch_inputs_agree(e2e_dir):
    folder = e2e_dir / "lstm"
    m = kiln.load(folder / "model.onnx")
    x, h0, c0 = (np.load(folder / f"input_{n}.npy") for n in ("x", "h0", "c0"))
    positional = m(x, h0, c0)
    named = m(c0=c0, x=x, h0=h0)
    mixed = m(x, c0=c0, h0=h0)
    torch_out = m(torch.from_numpy(x), torch.from_numpy(h0), torch.from_numpy(c0))
    assert all(isinstance(t, torch.Tensor) for t in torch_out)
    for a, b, c, d in zip(positional, named, mixed, torch_out):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)
        np.testing.assert_array_equal(a, d.numpy())


def test_dynamic_batch_compiles_each_shape(e2e_dir):
    m = kiln.load(e2e_dir / "gpt-dynamic" / "model.onnx")
    idx = np.load(e2e_dir / "gpt-dynamic" / "input_idx.npy")
    expected = np.load(e2e_dir / "gpt-dynamic" / "expected_logits.npy")
    one = m(idx[:1])
    both = m(idx)
    assert one.shape == (1, 8, 64) and both.shape == (2, 8, 64)
    np.testing.assert_allclose(one[0], expected[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(both, expected, rtol=1e-4, atol=1e-5)


def test_wrong_dtype_names_the_input_and_the_conversion(e2e_dir):
    m = mlp(e2e_dir)
    with pytest.raises(kiln.InputError) as e:
        m(np.zeros((2, 64), dtype=np.float64))
    assert str(e.value) == (
        "input 'x' expects f32[batch,64], got f64[2,64] from the call (convert it with .astype(numpy.float32))"
    )
    assert isinstance(e.value, ValueError) and isinstance(e.value, kiln.Error)


def test_wrong_shape_missing_and_unknown_inputs(e2e_dir):
    m = mlp(e2e_dir)
    with pytest.raises(kiln.InputError, match=r"input 'x' expects f32\[batch,64\], got f32\[2,63\].*dim 1 must be 64"):
        m(np.zeros((2, 63), dtype=np.float32))
    with pytest.raises(kiln.InputError, match=r"rank 1, expected rank 2"):
        m(np.zeros(64, dtype=np.float32))
    with pytest.raises(kiln.InputError, match=r"missing input 'x' \(expects f32\[batch,64\]\)"):
        m()
    with pytest.raises(kiln.InputError, match=r"unknown input 'y'; the model's inputs are: x"):
        m(y=np.zeros((2, 64), dtype=np.float32))
    with pytest.raises(kiln.InputError, match=r"2 inputs given positionally, but the model takes 1"):
        m(np.zeros((2, 64), np.float32), np.zeros((2, 64), np.float32))
    with pytest.raises(kiln.InputError, match=r"complex64, which Kiln does not take"):
        m(np.zeros((2, 64), dtype=np.complex64))
    with pytest.raises(kiln.InputError, match=r"expected a NumPy array or a torch tensor"):
        m("not an array")


def test_symbols_must_agree_between_inputs(e2e_dir):
    m = kiln.load(e2e_dir / "rnn" / "model.onnx")
    x = np.zeros((2, 5, 8), np.float32)
    h0 = np.zeros((1, 3, 16), np.float32)
    with pytest.raises(kiln.InputError, match=r"input 'h0'.*batch is 2 from input 'x'"):
        m(x, h0)


def test_cuda_without_a_gpu_raises_and_never_falls_back(e2e_dir):
    if kiln.devices()["cuda_available"]:
        pytest.skip("a usable CUDA device is present")
    with pytest.raises(kiln.DeviceError, match=r"CUDA is not usable"):
        kiln.load(e2e_dir / "mlp" / "model.onnx", device="cuda")
    with pytest.raises(ValueError, match=r"unknown device 'tpu'"):
        kiln.load(e2e_dir / "mlp" / "model.onnx", device="tpu")


def test_bad_model_files_raise_model_error(tmp_path):
    with pytest.raises(kiln.ModelError, match=r"cannot read ONNX model .*missing\.onnx"):
        kiln.load(tmp_path / "missing.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07not a protobuf at all\xff\xff")
    with pytest.raises(kiln.ModelError, match=r"bad\.onnx"):
        kiln.load(bad)
    with pytest.raises(kiln.ModelError, match=r"\.xyz"):
        kiln.load(tmp_path / "model.xyz")


def test_save_kc_and_load_it_back(e2e_dir, tmp_path):
    folder = e2e_dir / "cnn"
    m = kiln.load(folder / "model.onnx")
    x = np.load(folder / "input_x.npy")
    expected = np.load(folder / "expected_logits.npy")
    m(x)
    path = tmp_path / "cnn.kc"
    m.save(path)
    kc = kiln.load(path)
    assert kc.inputs[0].shape == (2, 3, 28, 28)
    np.testing.assert_allclose(kc(x), expected, rtol=1e-4, atol=1e-5)
    with pytest.raises(kiln.InputError, match=r"dim 0 must be 2"):
        kc(x[:1])
    with pytest.raises(kiln.Error, match=r"\.kc"):
        m.save(tmp_path / "cnn.onnx")


def test_save_before_a_call_needs_static_shapes(e2e_dir, tmp_path):
    m = kiln.load(e2e_dir / "cnn" / "model.onnx")
    with pytest.raises(kiln.Error, match=r"call the model once first"):
        m.save(tmp_path / "x.kc")
    static = kiln.load(e2e_dir / "transformer" / "model.onnx")
    static.save(tmp_path / "t.kc")
    x = np.load(e2e_dir / "transformer" / "input_x.npy")
    np.testing.assert_allclose(kiln.load(tmp_path / "t.kc")(x), static(x), rtol=1e-6, atol=1e-7)


def test_outputs_are_not_copied_and_never_reused(e2e_dir):
    m = mlp(e2e_dir)
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    first = m(x)
    kept = first.copy()
    assert not first.flags.owndata and first.flags.writeable  # a view of the tensor Kiln returned
    second = m(x + 1)
    assert first.__array_interface__["data"][0] != second.__array_interface__["data"][0]
    np.testing.assert_array_equal(first, kept)
    t = m(torch.from_numpy(x))
    t.add_(1)  # the torch tensor shares the NumPy array's memory
    np.testing.assert_array_equal(first, kept)


def test_two_threads_on_one_model(e2e_dir):
    folder = e2e_dir / "cnn"
    m = kiln.load(folder / "model.onnx")
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((2, 3, 28, 28)).astype(np.float32) for _ in range(2)]
    expected = [m(x) for x in xs]
    errors = []

    def work(k):
        try:
            for _ in range(20):
                np.testing.assert_allclose(m(xs[k]), expected[k], rtol=1e-6, atol=1e-7)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


def test_the_gil_is_released_while_kiln_computes(e2e_dir):
    m = kiln.load(e2e_dir / "resnetish" / "model.onnx", threads=1)
    x = np.random.default_rng(2).standard_normal((64, 3, 32, 32)).astype(np.float32)
    m(x)  # compiled
    done = threading.Event()
    ticks = 0

    def run():
        for _ in range(5):
            m(x)
        done.set()

    t = threading.Thread(target=run)
    t.start()
    while not done.is_set():
        ticks += 1
    t.join()
    # With the GIL held through each call, this loop would barely run.
    assert ticks > 1000


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def test_no_reference_leaks_over_10000_calls(e2e_dir):
    m = mlp(e2e_dir)
    x = np.random.default_rng(3).standard_normal((2, 64)).astype(np.float32)
    xt = torch.from_numpy(x)
    for _ in range(500):
        m(x)
        m(xt)
    gc.collect()
    before = rss_kib()
    refs = len(gc.get_objects())
    for _ in range(5000):
        m(x)
        m(x=xt)
    gc.collect()
    grown = rss_kib() - before
    assert len(gc.get_objects()) - refs < 100
    assert grown < 4096, f"RSS grew by {grown} KiB over 10,000 calls"


def test_devices_says_what_kiln_devices_json_says(kiln_binary):
    cli = subprocess.run([kiln_binary, "devices", "--json"], capture_output=True, text=True)
    got, expected = kiln.devices(), json.loads(cli.stdout)
    # PyPI's torch wheels carry CUDA's libraries (site-packages/nvidia) and
    # load them on import: in this process Kiln's dlopen of the same soname
    # then gets torch's copy, which kiln.devices() rightly names.
    for name, library in got.get("libraries", {}).items():
        if "/site-packages/nvidia/" in str(library.get("path", "")):
            expected["libraries"][name] = library
    assert got == expected
    assert isinstance(kiln.devices()["cuda_available"], bool)


def test_interpreter_and_jit_agree(e2e_dir):
    folder = e2e_dir / "transformer"
    x = np.load(folder / "input_x.npy")
    jit = kiln.load(folder / "model.onnx")(x)
    ref = kiln.load(folder / "model.onnx", interpret=True)(x)
    np.testing.assert_allclose(jit, ref, rtol=1e-4, atol=1e-5)


CUDA_SCRIPT = r"""
import sys
import numpy as np
import torch
import kiln

e2e = sys.argv[1]
devices = kiln.devices()
assert devices["cuda_available"] and devices["emulated"], devices["verdict"]
m = kiln.load(e2e + "/cnn/model.onnx", device="cuda")
assert m.device.startswith("cuda:0"), m.device
x = np.load(e2e + "/cnn/input_x.npy")
np.testing.assert_allclose(m(x), np.load(e2e + "/cnn/expected_logits.npy"), rtol=1e-4, atol=1e-5)

torch.manual_seed(0)
module = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)).eval()
features = torch.randn(4, 6)
compiled = kiln.compile(module, (features,), device="cuda")
with torch.no_grad():
    torch.testing.assert_close(compiled(features), module(features), rtol=1e-4, atol=1e-5)

labels = torch.tensor([0, 1, 2, 1])
losses, states = {}, {}
for device in ("cpu", "cuda"):
    torch.manual_seed(1)
    trainer = kiln.Trainer(torch.nn.Linear(6, 3), lr=0.1, momentum=0.9, device=device)
    losses[device] = [trainer.step(features, labels) for _ in range(3)]
    # A NaN loss (every label ignored) skips the update on the device too,
    # and the weights loaded after it are uploaded for the next step.
    before = trainer.state_dict()
    try:
        trainer.step(features, torch.full((4,), -100))
        raise AssertionError(device + ": a NaN loss did not raise")
    except kiln.Error as e:
        assert "the loss is nan" in str(e), str(e)
    for key, value in before.items():
        assert torch.equal(trainer.state_dict()[key], value), device + " " + key
    trainer.load_state_dict({key: value * 0.5 for key, value in before.items()})
    losses[device].append(trainer.step(features, labels))
    states[device] = trainer.state_dict()
np.testing.assert_allclose(losses["cuda"], losses["cpu"], rtol=1e-4)
for key, value in states["cpu"].items():
    torch.testing.assert_close(states["cuda"][key], value, rtol=1e-4, atol=1e-6)
print("ok")
"""


def test_cuda_on_the_emulated_gpu(e2e_dir):
    # ctest names the emulated GPU (test/devices/emulator/): kiln.load,
    # kiln.compile and kiln.Trainer with device="cuda" run Kiln's CUDA path.
    emulator = os.environ.get("KILN_CUDA_EMULATOR")
    if not emulator:
        pytest.fail("KILN_CUDA_EMULATOR must name the emulated GPU's libcuda.so.1 (ctest sets it)")
    env = dict(os.environ, KILN_CUDA_DRIVER=emulator)
    done = subprocess.run([sys.executable, "-c", CUDA_SCRIPT, str(e2e_dir)], env=env, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr


SAVE_CUDA_SCRIPT = r"""
import sys
import numpy as np
import kiln

folder, out = sys.argv[1], sys.argv[2]
m = kiln.load(folder + "/model.onnx", device="cuda")
assert m.device.startswith("cuda:0"), m.device
m(np.load(folder + "/input_x.npy"))
m.save(out)
print("ok")
"""


LOAD_CUDA_KC_SCRIPT = """
import sys
import numpy as np
import kiln

folder, kc = sys.argv[1], sys.argv[2]
m = kiln.load(kc, device="cuda")
assert m.device.startswith("cuda:0"), m.device
got = m(np.load(folder + "/input_x.npy"))
np.testing.assert_allclose(got, np.load(folder + "/expected_logits.npy"), rtol=1e-4, atol=1e-5)
print("ok")
"""


def test_save_a_cuda_model_writes_a_kc_that_kiln_run_runs(e2e_dir, tmp_path, kiln_binary):
    # save() of a model loaded with device="cuda" writes the CUDA program
    # (CUBINs and PTX for the emulated GPU), which `kiln run` runs on CUDA.
    emulator = os.environ.get("KILN_CUDA_EMULATOR")
    if not emulator:
        pytest.fail("KILN_CUDA_EMULATOR must name the emulated GPU's libcuda.so.1 (ctest sets it)")
    env = dict(os.environ, KILN_CUDA_DRIVER=emulator)
    folder = e2e_dir / "mlp"
    kc = tmp_path / "mlp-cuda.kc"
    done = subprocess.run([sys.executable, "-c", SAVE_CUDA_SCRIPT, str(folder), str(kc)], env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stdout + done.stderr
    ran = subprocess.run([kiln_binary, "run", str(kc), "--input", f"x={folder / 'input_x.npy'}", "--output-dir",
                          str(tmp_path / "out")], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    np.testing.assert_allclose(np.load(tmp_path / "out" / "logits.npy"), np.load(folder / "expected_logits.npy"),
                               rtol=1e-4, atol=1e-5)
    # The file holds a CUDA program: the CPU refuses it.
    cpu = subprocess.run([kiln_binary, "run", str(kc), "--input", f"x={folder / 'input_x.npy'}", "--device", "cpu"],
                         capture_output=True, text=True)
    assert cpu.returncode == 1 and "was compiled for CUDA" in cpu.stderr, cpu.stderr
    # kiln.load runs it on CUDA through the runtime's CUDA loader (no compiler
    # at load), and refuses it on the CPU, saying what to give instead.
    loaded = subprocess.run([sys.executable, "-c", LOAD_CUDA_KC_SCRIPT, str(folder), str(kc)], env=env,
                            capture_output=True, text=True)
    assert loaded.returncode == 0 and loaded.stdout.strip() == "ok", loaded.stdout + loaded.stderr
    with pytest.raises(kiln.DeviceError, match=r"holds a program compiled for CUDA; load it with device=\"cuda\""):
        kiln.load(kc, device="cpu")


@pytest.mark.parametrize("model", ["cnn", "gpt-dynamic"])
def test_bf16_precision_matches_the_interpreters_bf16(e2e_dir, model):
    """precision="bf16": the JIT (oneDNN's bf16 kernels, or f32 with a
    notice on a CPU without them) against the interpreter's bf16 and
    PyTorch's f32 output (bf16's rounding, docs/precision.md)."""
    folder = e2e_dir / model
    f32 = kiln.load(folder / "model.onnx")
    inputs = {p.name: np.load(folder / f"input_{p.name}.npy") for p in f32.inputs}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        jit = kiln.load(folder / "model.onnx", precision="bf16")(**inputs)
    notices = [str(w.message) for w in caught if issubclass(w.category, kiln.KilnWarning)]
    with open("/proc/cpuinfo") as cpuinfo:
        has_bf16 = "avx512_bf16" in cpuinfo.read()
    assert notices == ([] if has_bf16 else notices[:1]) and (has_bf16 or "computes in f32" in notices[0]), notices
    reference = kiln.load(folder / "model.onnx", precision="bf16", interpret=True)(**inputs)
    expected = np.load(folder / f"expected_{f32.outputs[0].name}.npy")
    jit = jit[0] if isinstance(jit, tuple) else jit
    reference = reference[0] if isinstance(reference, tuple) else reference
    np.testing.assert_allclose(jit, reference, rtol=1e-3, atol=1e-3)
    error = np.linalg.norm(jit - expected) / np.linalg.norm(expected)
    assert 1e-6 < error < 2e-2, error


def test_unknown_precision_is_a_value_error(e2e_dir):
    with pytest.raises(ValueError, match="precision='fp8': expected 'fp32', 'tf32', 'bf16' or 'fp16'"):
        kiln.load(e2e_dir / "mlp" / "model.onnx", precision="fp8")
