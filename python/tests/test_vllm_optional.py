"""vLLM stays optional: ``import mooring`` and ``mooring.store`` never import it, and the vLLM
connector's module, imported without vLLM, fails naming what is missing."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest


def test_importing_mooring_never_imports_vllm():
    code = (
        "import sys, mooring, mooring.store, mooring.integrations\n"
        "loaded = sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.'))\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_the_connector_module_without_vllm_says_vllm_is_missing():
    if importlib.util.find_spec("vllm") is not None:
        reason = "vLLM is installed here: python/tests/test_vllm.py loads the connector"
        print(f"SKIPPED: {reason}")
        pytest.skip(reason)
    with pytest.raises(ModuleNotFoundError) as raised:
        import mooring.integrations.vllm  # noqa: F401
    assert raised.value.name.split(".")[0] == "vllm"
