#!/usr/bin/env python3
"""What scripts/gpu-check writes to bench/RESULTS-gpu.md, and how the sections of separate runs merge.

The file holds one section per part, between `<!-- gpu-check:NAME -->` and `<!-- /gpu-check:NAME -->`, in the
order machine, e2e, conformance, bench; a run replaces the sections of the parts it ran and keeps the others,
so parts run in separate calls on a lent GPU machine make one file. The bench table is merged by row: a row
of a configuration (model, batch) that the newer run did not time stays, with the card it was timed on.

  gpu-check-results.py device-line DEVICES.json              one line: GPU, compute capability, driver, CUDA
  gpu-check-results.py problem DEVICES.json                  why CUDA is not usable, on one line
  gpu-check-results.py machine DEVICES.json KILN_VERSION BUILD_INFO PART   the machine section (stdout)
  gpu-check-results.py bench MANIFEST.json KILN.tsv MAX_ERR   the bench section (stdout); exit 1 when Kiln failed
  gpu-check-results.py merge RESULTS.md NAME SECTION.md       replace (or add) section NAME of RESULTS.md

DEVICES.json is `kiln devices --json`. KILN.tsv has one line per configuration: model, batch, kiln's exit
status, its --bench --json output file, its --output-dir, its log file. Needs Python 3 and, for `bench`, NumPy.
"""
import datetime
import json
import os
import re
import sys

ORDER = ["machine", "e2e", "conformance", "bench"]
TITLE = """# Kiln on a GPU: `scripts/gpu-check` results

Written by `scripts/gpu-check` ([docs/cuda.md](../docs/cuda.md), section 6) on a lent GPU machine, from
the portable bundle. Each part (`--part e2e`, `conformance`, `bench`) replaces its own section and the
machine section, so parts run in separate calls make one file; each section names the GPU it ran on.
"""


def load_devices(path):
    with open(path) as f:
        return json.load(f)


def first_device(devices):
    usable = [d for d in devices.get("devices") or [] if d.get("usable")]
    return usable[0] if usable else None


def device_line(devices):
    d = first_device(devices)
    driver = devices.get("driver") or {}
    if not d:
        return "no usable CUDA device"
    return (f"{d['name']} (compute {d['compute_capability']}), driver {driver.get('release') or 'unknown'} "
            f"(CUDA {driver.get('cuda_version') or 'unknown'})")


def machine_section(devices, kiln_version, build_info, part):
    d = first_device(devices)
    driver = devices.get("driver") or {}
    rows = []
    if d:
        rows.append(("GPU", f"{d['name']}, compute {d['compute_capability']}, {d['multiprocessors']} SMs, "
                            f"{d['memory_total_bytes'] / 2**30:.1f} GiB"))
    else:
        rows.append(("GPU", "none usable: " + (devices.get("message") or "").splitlines()[0]))
    rows.append(("driver", f"release {driver.get('release') or 'unknown'}, "
                           f"CUDA {driver.get('cuda_version') or 'unknown'} "
                           f"(`{driver.get('path')}`; Kiln built for CUDA {devices.get('kiln_cuda_version')})"))
    libs = []
    found = devices.get("libraries") or {}
    for key, name in (("nvrtc", "NVRTC"), ("cublas", "cuBLAS"), ("cublaslt", "cuBLASLt"), ("cudnn", "cuDNN")):
        lib = found.get(key) or {}
        libs.append(f"{name} {lib.get('version')} (`{lib.get('path')}`)" if lib.get("found") else f"{name}: not found")
    rows.append(("libraries", "; ".join(libs) or "unknown"))
    rows.append(("Kiln", kiln_version.strip()))
    if build_info.strip():
        rows.append(("bundle", "; ".join(line.strip() for line in build_info.strip().splitlines()[1:3])))
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows.append(("written", f"{stamp}, by `--part {part}`"))
    lines = ["## Machine", "", "| | |", "|---|---|"] + [f"| {k} | {v.replace('|', '/')} |" for k, v in rows]
    return "\n".join(lines) + "\n"


def fmt_ms(value):
    return "—" if value is None else f"{value:.3f}"


def fmt_ratio(a, b):
    return "—" if a is None or b is None or not b else f"{a / b:.2f}"


def relative_error(actual_path, expected_path):
    import numpy as np
    a = np.load(actual_path).astype(np.float64)
    e = np.load(expected_path).astype(np.float64)
    if a.shape != e.shape:
        return float("inf"), f"shape {list(a.shape)}, expected {list(e.shape)}"
    if not np.all(np.isfinite(a)):
        return float("inf"), "non-finite values"
    norm = np.linalg.norm(e)
    return float(np.linalg.norm(a - e) / norm) if norm else float(np.linalg.norm(a)), None


def bench_section(manifest_path, kiln_tsv, max_err):
    with open(manifest_path) as f:
        manifest = json.load(f)
    kiln, profiles = {}, {}
    with open(kiln_tsv) as f:
        for line in f:
            if line.strip():
                model, batch, status, json_path, out_dir, log, *profile = line.rstrip("\n").split("\t")
                kiln[(model, int(batch))] = (int(status), json_path, out_dir, log)
                if profile:
                    profiles[(model, int(batch))] = profile[0]
    card = manifest["device"]
    rows, failures, kiln_failed = [], [], False
    for config in manifest["configs"]:
        key = (config["model"], config["batch"])
        kiln_ms, kiln_device_ms, error = None, None, None
        status, json_path, out_dir, log = kiln.get(key, (None, "", "", ""))
        if status is None:
            error = "not run"
        elif status != 0:
            with open(log, errors="replace") as f:
                tail = [line.strip() for line in f if line.strip()]
            error = f"kiln exit status {status}: " + (tail[-1] if tail else "no output")
        else:
            with open(json_path) as f:
                timing = json.load(f)
            kiln_ms, kiln_device_ms = timing["median_ms"], timing.get("device_ms")
            errs = []
            for name in config["outputs"]:
                err, problem = relative_error(os.path.join(out_dir, f"{name}.npy"),
                                              os.path.join(config["dir"], f"expected_{name}.npy"))
                if problem or err > max_err:
                    error = f"output {name} differs from PyTorch's: " + (problem or f"relative error {err:.2e}")
                errs.append(err)
            config["kiln_rel_err"] = max(errs)
        if error:
            kiln_failed = True
            failures.append(f"{config['model']} batch {config['batch']}: {error}")
        # The faster torch.compile mode measured: the default, or max-autotune where it was timed.
        modes = [ms for ms in (config.get("compile_ms"), config.get("autotune_ms")) if ms is not None]
        compile_ms = min(modes) if modes else None
        rows.append([config["model"], str(config["batch"]),
                     fmt_ms(kiln_ms) if not error else "FAIL",
                     fmt_ms(config.get("eager_ms")),
                     fmt_ms(config.get("compile_ms")) if config.get("compile_ms") is not None else
                     ("FAIL" if config.get("compile_error") else "—"),
                     fmt_ms(config.get("autotune_ms")) if config.get("autotune_ms") is not None else
                     ("FAIL" if config.get("autotune_error") else "—"),
                     fmt_ratio(kiln_ms, config.get("eager_ms")) if not error else "—",
                     fmt_ratio(kiln_ms, compile_ms) if not error else "—",
                     fmt_ms(kiln_device_ms) if not error else "—",
                     fmt_ms(config.get("eager_device_ms")), fmt_ms(config.get("compile_device_ms")),
                     f"{config['kiln_rel_err']:.1e}" if "kiln_rel_err" in config else "—", card])
        if config.get("compile_error"):
            failures.append(f"{config['model']} batch {config['batch']}: torch.compile: {config['compile_error']}")
        if config.get("autotune_error"):
            failures.append(f"{config['model']} batch {config['batch']}: torch.compile max-autotune: "
                            f"{config['autotune_error']}")
    models = "; ".join(f"`{name}`: {m['description']} ({m['parameters'] / 1e6:.1f} M parameters, exported by "
                       f"{m['exporter']} in {m['export_s']:.0f} s)" for name, m in manifest["models"].items())
    lines = [
        "## Latency (`--part bench`)", "",
        f"{card}; PyTorch {manifest['torch']} (CUDA {manifest['torch_cuda']}, cuDNN {manifest['cudnn']}); "
        f"compile: {manifest['compile']}. Models: {models}.", "",
        f"Float32 everywhere, TF32 off in both (PyTorch: `allow_tf32 = False` for matmul and cuDNN; Kiln: no "
        f"`--allow-tf32`). Medians of {manifest['runs']} runs after {manifest['warmup']} warm-up runs. "
        "**Kiln**, **eager** and **compile** time the same thing: inputs from host memory to the GPU, the model, "
        "the outputs back to host memory (`kiln run MODEL --device cuda --bench N --json`, which replays a CUDA "
        "graph; PyTorch synchronized around each run). *Kiln/compile* divides by the faster torch.compile "
        "mode measured for the row (max-autotune only where --bench-autotune asked for it). *On device* is, for Kiln, the steps of its runs "
        "between the copies to and from the device (CUDA events: the JSON's device_ms; the rest of a run is "
        "copy_in_ms, copy_out_ms and the host's staging_ms), and for PyTorch the model with the input already "
        "on the GPU (CUDA events). Ratios below 1 mean Kiln is faster. Kiln's outputs are checked first "
        f"against PyTorch eager's (‖kiln − torch‖ / ‖torch‖ ≤ {max_err:g}: *rel err*). "
        "A row of a model that a later run did not time stays from the run that did, with its card.", "",
        "| model | batch | Kiln ms | eager ms | compile ms | max-autotune ms | Kiln/eager | Kiln/compile "
        "| Kiln on device ms | eager on device ms | compile on device ms | rel err | card |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ] + ["| " + " | ".join(r) + " |" for r in rows]
    if failures:
        lines += ["", "Failures:", ""] + [f"- {f.replace('|', '/')}" for f in failures]
    lines += profile_lines(manifest["configs"], profiles)
    print("\n".join(lines))
    return 1 if kiln_failed else 0


def profile_lines(configs, profiles, top=8):
    """Each timed row's `kiln run --profile`: its total, its top steps and its time by kind."""
    lines = []
    for config in configs:
        path = profiles.get((config["model"], config["batch"]))
        if not path or not os.path.exists(path):
            continue
        with open(path, errors="replace") as f:
            text = [line.rstrip() for line in f if not line.startswith("kiln run: note:")]
        if not text or not text[0].startswith("total ms"):
            continue
        split = next((i for i, line in enumerate(text) if line.startswith("by kind:")), len(text))
        steps = [line for line in text[:split] if line.strip()]
        total = next((line.strip() for line in steps if " ms in " in line), "")
        rows = [line for line in steps[1:] if line.startswith(" ") and " ms in " not in line][:top]
        kinds = [line for line in text[split + 1:] if line.startswith(" ")][:top]
        if not lines:
            lines += ["", "Kiln's profile of each row (`kiln run --device cuda --profile`: every step launched and "
                      "timed with CUDA events, no graph replay; totals are over 5 runs, ms/call is per run): the top "
                      "steps, then the time by kind.", ""]
        lines += [f"**{config['model']}, batch {config['batch']}**: {total}", "", "```", steps[0]] + rows + \
                 (["by kind:"] + kinds if kinds else []) + ["```", ""]
    return lines


def split_sections(text):
    """{name: section text with its markers} and the text before the first section."""
    sections = {}
    for m in re.finditer(r"<!-- gpu-check:(\w+) -->\n.*?<!-- /gpu-check:\1 -->\n", text, re.S):
        sections[m.group(1)] = m.group(0)
    first = re.search(r"<!-- gpu-check:\w+ -->", text)
    head = text[:first.start()] if first else text
    return head, sections


def table_rows(section):
    """The data rows of the section's table, keyed by their first two cells."""
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 2 and not set(line) <= set("|-: ") and cells[0] != "model":
            rows[(cells[0], cells[1])] = line
    return rows


def merge_rows(old, new):
    """`new` with the table rows of `old` whose (model, batch) it lacks, sorted by model then batch."""
    old_rows, new_rows = table_rows(old), table_rows(new)
    columns = {row.count("|") for row in new_rows.values()}
    # Rows of an older table with other columns are dropped, not misaligned.
    kept = {k: v for k, v in old_rows.items() if k not in new_rows and v.count("|") in columns}
    if not kept:
        return new
    rows = {**kept, **new_rows}
    order = sorted(rows, key=lambda k: (k[0], int(k[1]) if k[1].isdigit() else 0))
    lines = new.splitlines()
    last = max(i for i, line in enumerate(lines) if line in new_rows.values())
    first = min(i for i, line in enumerate(lines) if line in new_rows.values())
    lines[first:last + 1] = [rows[k] for k in order]
    return "\n".join(lines) + "\n"


def merge(results_path, name, section_path):
    if name not in ORDER:
        raise SystemExit(f"gpu-check-results.py: unknown section '{name}' (expected one of {', '.join(ORDER)})")
    with open(section_path) as f:
        body = f.read().rstrip("\n") + "\n"
    text = open(results_path).read() if os.path.exists(results_path) else TITLE
    head, sections = split_sections(text)
    new = f"<!-- gpu-check:{name} -->\n{body}<!-- /gpu-check:{name} -->\n"
    if name == "bench" and name in sections:
        new = merge_rows(sections[name], new)
    sections[name] = new
    out = head.rstrip("\n") + "\n\n" + "\n".join(sections[n] for n in ORDER if n in sections)
    with open(results_path + ".tmp", "w") as f:
        f.write(out)
    os.replace(results_path + ".tmp", results_path)


def main(argv):
    if len(argv) >= 2 and argv[1] == "device-line" and len(argv) == 3:
        print(device_line(load_devices(argv[2])))
        return 0
    if len(argv) >= 2 and argv[1] == "problem" and len(argv) == 3:
        message = load_devices(argv[2]).get("message") or ""
        print(" ".join(line.strip() for line in message.splitlines()))
        return 0
    if len(argv) >= 2 and argv[1] == "machine" and len(argv) == 6:
        with open(argv[4]) if os.path.exists(argv[4]) else open(os.devnull) as f:
            build_info = f.read()
        print(machine_section(load_devices(argv[2]), argv[3], build_info, argv[5]), end="")
        return 0
    if len(argv) >= 2 and argv[1] == "bench" and len(argv) == 5:
        return bench_section(argv[2], argv[3], float(argv[4]))
    if len(argv) >= 2 and argv[1] == "merge" and len(argv) == 5:
        merge(argv[2], argv[3], argv[4])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
