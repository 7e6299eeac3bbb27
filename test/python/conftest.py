"""The pytest suite of the kiln Python package (test/python/README.md).

ctest runs it with the package of the build tree on PYTHONPATH
(build/python), KILN_BINARY naming the `kiln` tool and a kernel cache in
the build tree; run by hand:

    PYTHONPATH=build/python KILN_BINARY=build/tools/kiln /usr/bin/python3 -m pytest test/python
"""
import importlib.util
import os
import pathlib

import pytest

SOURCE_DIR = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def e2e_models():
    """The end-to-end models of test/e2e as PyTorch modules (scripts/export-e2e-models.py)."""
    spec = importlib.util.spec_from_file_location("export_e2e_models", SOURCE_DIR / "scripts" / "export-e2e-models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import torch

    torch.manual_seed(0)  # as the script seeds the weights
    return list(module.models())


@pytest.fixture(scope="session")
def e2e_dir():
    return SOURCE_DIR / "test" / "e2e"


@pytest.fixture(scope="session")
def kiln_binary():
    path = os.environ.get("KILN_BINARY")
    if not path:
        pytest.fail("KILN_BINARY must name the kiln tool (ctest sets it)")
    return path
