#!/usr/bin/env python3
"""The PyTorch half of `scripts/gpu-check --part bench`: exports the GPU benchmark models to ONNX and times them
in PyTorch, eager and torch.compile, on the same GPU that Kiln is then timed on.

Models (random weights from fixed seeds, eval mode, float32), each exported once with a dynamic batch
dimension (torch.onnx.export, the TorchScript exporter, opset 17, constant folding; BatchNorm folds into Conv):

  resnet50  torchvision's ResNet-50, input x f32[batch,3,224,224], output logits f32[batch,1000]
  gpt2      a decoder shaped like GPT-2 small: token and position embeddings, 12 pre-LayerNorm blocks of causal
            self-attention (12 heads, written out: matmul, masked_fill, softmax, as scripts/export-e2e-models.py's
            GPT) and an MLP of width 3072 with tanh-GELU (as GPT-2), final LayerNorm and an untied LM head over
            the vocabulary (50257), applied to the last position only, as generating a token does; input idx
            i64[batch,seq] (seq 128), output logits f32[batch,vocab]
  bert      BERT-base from the machine's `transformers` (BertModel built from BertConfig(): 12 layers, width
            768, 12 heads, eager attention; random weights, nothing downloaded); input input_ids
            i64[batch,seq] (seq 128), output the last hidden state f32[batch,seq,768]; without `transformers`,
            the same shapes in plain PyTorch (post-LN nn.TransformerEncoderLayer, erf-GELU)
  hf-gpt2   GPT-2 small from `transformers` (GPT2LMHeadModel built from GPT2Config(), eager attention, tied LM
            head): input input_ids i64[batch,seq] (seq 128), output the last position's logits
            f32[batch,50257]; without `transformers`, the gpt2 decoder above
  vit_b_16  torchvision's ViT-B/16, input x f32[batch,3,224,224], output logits f32[batch,1000]

For each configuration (model, batch; default batches 1 and 64 for resnet50 and vit_b_16, 1 and 16 for gpt2
and hf-gpt2, 1 and 32 for bert) it writes
OUT/<model>-b<batch>/input_<name>.npy and expected_<name>.npy (PyTorch eager on the GPU), and times PyTorch
with TF32 off (torch.backends.cuda.matmul.allow_tf32 = False, torch.backends.cudnn.allow_tf32 = False,
float32 matmul precision "highest"), W warm-up runs then N timed ones, median:

  eager_ms, compile_ms                the inputs from host memory to the GPU, the model, the outputs back to
                                      host memory, synchronized: what `kiln run --bench` times
  eager_device_ms, compile_device_ms  the model alone on inputs already on the GPU (CUDA events)

torch.compile is the default mode (no CUDA graphs), dynamic=False, compiled afresh per configuration; its
compilation time (the first call) is recorded, and a failure is recorded instead of its times. For the
configurations --autotune names (such as resnet50:64,bert:32), torch.compile(mode="max-autotune")
is timed too (autotune_ms, autotune_device_ms); the results compare Kiln with the faster of the two modes.
OUT/manifest.json holds everything; OUT/manifest.tsv lists `model batch model.onnx config-dir` for the shell.

  python3 bench/export-gpu-models.py OUT [--models resnet50,gpt2] [--runs 50] [--warmup 10]
          [--resnet50-batches 1,64] [--gpt2-batches 1,16] [--bert-batches 1,32] [--hf-gpt2-batches 1,16]
          [--vit-batches 1,64] [--gpt2-layers 12] [--gpt2-vocab 50257] [--gpt2-seq 128] [--image-size 224]
          [--autotune resnet50:64,bert:32] [--no-compile] [--device cuda|cpu]

--device cpu (and smaller --gpt2-layers/--gpt2-vocab/--image-size; --gpt2-layers also sets the layers of bert
and hf-gpt2) only tests the export on a machine without a GPU: its times say nothing about a GPU.
"""
import argparse
import inspect
import json
import math
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

OPSET = 17


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_head, context):
        super().__init__()
        self.n_head = n_head
        self.scale = 1.0 / math.sqrt(d_model // n_head)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        k = k.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        v = v.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d_model, n_head, context):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_head, context)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Decoder(nn.Module):
    """GPT-2 small's shape: the logits of the last position, as one step of generation computes them."""

    def __init__(self, vocab, d_model, n_head, n_layer, context):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.Sequential(*[Block(d_model, n_head, context) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        pos = torch.arange(t, dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.blocks(self.tok(idx) + self.pos(pos))
        return self.head(self.ln_f(x[:, -1, :]))


class LastPositionLogits(nn.Module):
    """A `transformers` causal LM's logits at the last position only, as one step of generation computes them."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits[:, -1, :]


class LastHiddenState(nn.Module):
    """A `transformers` encoder's last hidden state, the tensor a fine-tuning head reads."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).last_hidden_state


class PlainBert(nn.Module):
    """BERT-base's shapes without `transformers`: token, position and segment embeddings, LayerNorm, post-LN
    encoder layers with erf-GELU."""

    def __init__(self, vocab, d_model, n_head, n_layer, context):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.seg = nn.Embedding(2, d_model)
        self.ln = nn.LayerNorm(d_model, eps=1e-12)
        layer = nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, dropout=0.0, activation="gelu",
                                           batch_first=True, layer_norm_eps=1e-12)
        self.encoder = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)

    def forward(self, input_ids):
        t = input_ids.shape[1]
        pos = torch.arange(t, dtype=torch.long, device=input_ids.device).unsqueeze(0)
        x = self.tok(input_ids) + self.pos(pos) + self.seg(torch.zeros_like(input_ids))
        return self.encoder(self.ln(x))


def transformers_or_none():
    try:
        import transformers
        return transformers
    except ImportError:
        return None


def build_model(name, args):
    """(module, input name, output name, description, input maker(batch, generator) -> CPU tensor)."""
    torch.manual_seed(0)
    if name == "resnet50":
        import torchvision
        module = torchvision.models.resnet50(weights=None)
        size = args.image_size
        return (module, "x", "logits", f"torchvision ResNet-50, x f32[batch,3,{size},{size}]",
                lambda batch, gen: torch.randn(batch, 3, size, size, generator=gen))
    if name == "gpt2":
        module = Decoder(args.gpt2_vocab, 768, 12, args.gpt2_layers, args.gpt2_seq)
        vocab, seq = args.gpt2_vocab, args.gpt2_seq
        return (module, "idx", "logits",
                f"GPT-2-small-shaped decoder: {args.gpt2_layers} layers, width 768, 12 heads, tanh-GELU, "
                f"vocab {vocab}, idx i64[batch,{seq}], last-position logits",
                lambda batch, gen: torch.randint(0, vocab, (batch, seq), generator=gen, dtype=torch.long))
    if name == "vit_b_16":
        import torchvision
        module = torchvision.models.vit_b_16(weights=None, image_size=args.image_size)
        # torchvision zeroes the classifier (for fine-tuning): logits of 0 would compare equal whatever the
        # encoder computed, so it gets random weights too.
        nn.init.normal_(module.heads.head.weight, std=0.02)
        size = args.image_size
        return (module, "x", "logits", f"torchvision ViT-B/16, x f32[batch,3,{size},{size}]",
                lambda batch, gen: torch.randn(batch, 3, size, size, generator=gen))
    seq = args.gpt2_seq
    hf = transformers_or_none()
    if name == "bert":
        if hf:
            config = hf.BertConfig(num_hidden_layers=args.gpt2_layers, attn_implementation="eager")
            module, source = LastHiddenState(hf.BertModel(config, add_pooling_layer=False)), \
                f"transformers {hf.__version__} BertModel(BertConfig()), eager attention"
            vocab = config.vocab_size
        else:
            vocab = 30522
            module, source = PlainBert(vocab, 768, 12, args.gpt2_layers, 512), "plain PyTorch (no transformers)"
        return (module, "input_ids", "hidden",
                f"BERT-base: {args.gpt2_layers} layers, width 768, 12 heads, input_ids i64[batch,{seq}], last "
                f"hidden state; {source}",
                lambda batch, gen: torch.randint(0, vocab, (batch, seq), generator=gen, dtype=torch.long))
    if name == "hf-gpt2":
        if hf:
            config = hf.GPT2Config(n_layer=args.gpt2_layers, attn_implementation="eager")
            module, source = LastPositionLogits(hf.GPT2LMHeadModel(config)), \
                f"transformers {hf.__version__} GPT2LMHeadModel(GPT2Config()), eager attention"
            vocab = config.vocab_size
        else:
            vocab = args.gpt2_vocab
            module = Decoder(vocab, 768, 12, args.gpt2_layers, 1024)
            source = "the gpt2 decoder (no transformers)"
        return (module, "input_ids", "logits",
                f"GPT-2 small: {args.gpt2_layers} layers, width 768, 12 heads, input_ids i64[batch,{seq}], "
                f"last-position logits; {source}",
                lambda batch, gen: torch.randint(0, vocab, (batch, seq), generator=gen, dtype=torch.long))
    raise ValueError(f"unknown model '{name}' (expected resnet50, gpt2, bert, hf-gpt2 or vit_b_16)")


def export_onnx(module, example, path, input_name, output_name):
    """Exports with the TorchScript exporter (opset 17, as the e2e models); newer PyTorch, whose default is the
    dynamo exporter, is asked for it explicitly, and where it no longer has it the dynamo exporter (opset 18,
    weights inside the file) is used. Returns a description of the exporter used."""
    # nn.MultiheadAttention's inference fast path (ViT's attention under no_grad) is one fused aten op that
    # the TorchScript exporter cannot write; exported through its composite ops instead. Timing keeps it.
    mha = getattr(torch.backends, "mha", None)
    fastpath = mha.get_fastpath_enabled() if mha else None
    if mha:
        mha.set_fastpath_enabled(False)
    try:
        return export_onnx_with(module, example, path, input_name, output_name)
    finally:
        if mha:
            mha.set_fastpath_enabled(fastpath)


def export_onnx_with(module, example, path, input_name, output_name):
    kwargs = dict(input_names=[input_name], output_names=[output_name],
                  dynamic_axes={input_name: {0: "batch"}, output_name: {0: "batch"}}, opset_version=OPSET)
    if "dynamo" not in inspect.signature(torch.onnx.export).parameters:
        torch.onnx.export(module, (example,), path, do_constant_folding=True, **kwargs)
        return f"torch.onnx.export (TorchScript exporter), opset {OPSET}"
    try:
        torch.onnx.export(module, (example,), path, do_constant_folding=True, dynamo=False, **kwargs)
        return f"torch.onnx.export (TorchScript exporter), opset {OPSET}"
    except Exception as error:  # noqa: BLE001 - any failure of the old exporter falls back to the new one
        print(f"the TorchScript exporter failed ({first_line(error)}); using the dynamo exporter", flush=True)
    kwargs["opset_version"] = 18
    torch.onnx.export(module, (example,), path, dynamo=True, external_data=False, **kwargs)
    return "torch.onnx.export (dynamo exporter), opset 18"


def median(values):
    return statistics.median(values) if values else None


def time_host(fn, x_host, device, runs, warmup):
    """Median ms of host input -> device -> model -> host output, synchronized."""
    def once():
        return fn(x_host.to(device)).cpu()
    for _ in range(warmup):
        once()
    times = []
    for _ in range(runs):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        once()  # .cpu() waits for the GPU
        times.append((time.perf_counter() - start) * 1000)
    return median(times)


def time_device(fn, x_dev, device, runs, warmup):
    """Median ms of the model alone on an input already on the device (CUDA events)."""
    for _ in range(warmup):
        fn(x_dev)
    times = []
    for _ in range(runs):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(x_dev)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            start = time.perf_counter()
            fn(x_dev)
            times.append((time.perf_counter() - start) * 1000)
    return median(times)


def time_compiled(module, options, key, label, config, x_host, x_dev, expected, device, args):
    """torch.compile(module, dynamic=False, **options), compiled afresh: into `config`, under `key`, its
    compilation time (the first call), its outputs' error against eager's and its times; or, when it fails,
    the error (a compiler failure is a result to report, not a stop)."""
    name, batch = config["model"], config["batch"]
    try:
        torch._dynamo.reset()
        compiled = torch.compile(module, dynamic=False, **options)
        start = time.perf_counter()
        out = compiled(x_dev)
        if device.type == "cuda":
            torch.cuda.synchronize()
        config[f"{key}_s"] = time.perf_counter() - start
        config[f"{key}_rel_err"] = relative_error(out.cpu().numpy(), expected)
        config[f"{key}_ms"] = time_host(compiled, x_host, device, args.runs, args.warmup)
        config[f"{key}_device_ms"] = time_device(compiled, x_dev, device, args.runs, args.warmup)
        print(f"{name} batch {batch}: {label} {config[f'{key}_ms']:.3f} ms (on device "
              f"{config[f'{key}_device_ms']:.3f} ms; compiled in {config[f'{key}_s']:.0f} s)", flush=True)
    except Exception as error:  # noqa: BLE001
        config[f"{key}_error"] = first_line(error)
        print(f"{name} batch {batch}: {label} failed: {config[f'{key}_error']}", flush=True)


def relative_error(actual, expected):
    """||actual - expected|| / ||expected|| in float64."""
    a, e = np.asarray(actual, dtype=np.float64), np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        return float("inf")
    norm = np.linalg.norm(e)
    return float(np.linalg.norm(a - e) / norm) if norm else float(np.linalg.norm(a))


def first_line(error):
    text = f"{type(error).__name__}: {error}"
    return text.strip().splitlines()[0][:300]


def parse_batches(text):
    batches = [int(b) for b in text.split(",") if b]
    if not batches or min(batches) < 1:
        raise argparse.ArgumentTypeError(f"expected batch sizes like 1,64, got '{text}'")
    return batches


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", help="folder for the models, inputs, expected outputs and manifest")
    parser.add_argument("--models", default="resnet50,gpt2")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--resnet50-batches", type=parse_batches, default=[1, 64])
    parser.add_argument("--gpt2-batches", type=parse_batches, default=[1, 16])
    parser.add_argument("--bert-batches", type=parse_batches, default=[1, 32])
    parser.add_argument("--hf-gpt2-batches", type=parse_batches, default=[1, 16])
    parser.add_argument("--vit-batches", type=parse_batches, default=[1, 64])
    parser.add_argument("--autotune", default="",
                        help="model:batch configurations also timed with torch.compile(mode='max-autotune'), "
                             "such as resnet50:64,bert:32 (minutes each on an H200)")
    parser.add_argument("--gpt2-layers", type=int, default=12)
    parser.add_argument("--gpt2-vocab", type=int, default=50257)
    parser.add_argument("--gpt2-seq", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"export-gpu-models.py: error: PyTorch {torch.__version__} sees no CUDA device "
              f"(torch.version.cuda {torch.version.cuda})", file=sys.stderr)
        return 1
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    can_compile = hasattr(torch, "compile") and not args.no_compile
    os.makedirs(args.out, exist_ok=True)

    manifest = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if device.type == "cuda" else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "tf32": False,
        "runs": args.runs,
        "warmup": args.warmup,
        "compile": "torch.compile, default mode, dynamic=False" if can_compile else
                   ("skipped (--no-compile)" if args.no_compile else f"not in PyTorch {torch.__version__}"),
        "models": {},
        "configs": [],
    }
    tsv = []
    autotuned = {c for c in args.autotune.split(",") if c}
    for name in [m for m in args.models.split(",") if m]:
        module, input_name, output_name, description, make_input = build_model(name, args)
        module.eval()
        folder = os.path.join(args.out, name)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, "model.onnx")
        gen = torch.Generator().manual_seed(1)
        start = time.perf_counter()
        with torch.no_grad():
            exporter = export_onnx(module, make_input(1, gen), path, input_name, output_name)
        export_s = time.perf_counter() - start
        params = sum(p.numel() for p in module.parameters())
        print(f"{name}: exported in {export_s:.1f} s ({os.path.getsize(path) / 2**20:.0f} MiB, "
              f"{params / 1e6:.1f} M parameters)", flush=True)
        manifest["models"][name] = {"onnx": os.path.abspath(path), "description": description,
                                    "exporter": exporter, "export_s": export_s, "parameters": params}
        module.to(device)
        batches = {"resnet50": args.resnet50_batches, "gpt2": args.gpt2_batches, "bert": args.bert_batches,
                   "hf-gpt2": args.hf_gpt2_batches, "vit_b_16": args.vit_batches}[name]
        for batch in batches:
            config_dir = os.path.join(args.out, f"{name}-b{batch}")
            os.makedirs(config_dir, exist_ok=True)
            x_host = make_input(batch, torch.Generator().manual_seed(100 + batch))
            x_dev = x_host.to(device)
            config = {"model": name, "batch": batch, "dir": os.path.abspath(config_dir),
                      "inputs": {input_name: f"input_{input_name}.npy"}, "outputs": [output_name]}
            with torch.inference_mode():
                expected = module(x_dev).cpu().numpy()
                np.save(os.path.join(config_dir, f"input_{input_name}.npy"), x_host.numpy())
                np.save(os.path.join(config_dir, f"expected_{output_name}.npy"), expected)
                config["eager_ms"] = time_host(module, x_host, device, args.runs, args.warmup)
                config["eager_device_ms"] = time_device(module, x_dev, device, args.runs, args.warmup)
                print(f"{name} batch {batch}: eager {config['eager_ms']:.3f} ms "
                      f"(on device {config['eager_device_ms']:.3f} ms)", flush=True)
                if can_compile:
                    time_compiled(module, {}, "compile", "torch.compile", config, x_host, x_dev, expected, device,
                                  args)
                if can_compile and f"{name}:{batch}" in autotuned:
                    time_compiled(module, {"mode": "max-autotune"}, "autotune", "torch.compile max-autotune", config,
                                  x_host, x_dev, expected, device, args)
            manifest["configs"].append(config)
            tsv.append(f"{name}\t{batch}\t{os.path.abspath(path)}\t{os.path.abspath(config_dir)}")
        module.to("cpu")
        del module
        if device.type == "cuda":
            torch.cuda.empty_cache()

    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    with open(os.path.join(args.out, "manifest.tsv"), "w") as f:
        f.write("\n".join(tsv) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
