"""``torch.save`` straight into ``open_part``: one pass, hashed while written, and the
checkpoint restores with ``torch.load`` in a fresh process."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flashruntime.checkpoint import latest_valid_manifest, open_part, verify_manifest, write_manifest
from flashruntime.checkpoint.local import clear_verification_cache

pytestmark = pytest.mark.torch
torch = pytest.importorskip("torch")

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_torch_save_into_parts_and_restore(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()
    step_dir = tmp_path / "ckpt" / "step-000040"
    with open_part(step_dir, "model.pt") as m:
        torch.save(model.state_dict(), m)
    with open_part(step_dir, "optimizer.pt") as o:
        torch.save(optimizer.state_dict(), o)
    manifest = write_manifest(
        step_dir, job_id="local", attempt_id="local", step=40, digests={"model.pt": m.digest, "optimizer.pt": o.digest}
    )
    for part in manifest.parts:
        data = (step_dir / part.key).read_bytes()
        assert part.sha256 == hashlib.sha256(data).hexdigest() and part.size_bytes == len(data)
    clear_verification_cache()
    assert verify_manifest(manifest, step_dir)

    script = (
        "import sys, torch\n"
        "from flashruntime.checkpoint import latest_valid_manifest\n"
        "m = latest_valid_manifest(sys.argv[1])\n"
        "state = torch.load(m.storage_prefix + '/model.pt', map_location='cpu', weights_only=True)\n"
        "print(m.step, sorted(state), float(sum(v.double().sum() for v in state.values())))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "ckpt")],
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout.split(" ", 1)
    assert out[0] == "40"
    expected_total = float(sum(v.double().sum() for v in model.state_dict().values()))
    assert out[1].strip() == f"{sorted(model.state_dict())} {expected_total}"
    assert latest_valid_manifest(tmp_path / "ckpt").manifest_id == manifest.manifest_id


def test_large_tensors_hash_correctly(tmp_path: Path) -> None:
    state = {f"w{i}": torch.randn(1 << 20) for i in range(6)}  # 24 MiB, 4 MiB per storage
    with open_part(tmp_path, "big.pt") as f:
        torch.save(state, f)
    data = (tmp_path / "big.pt").read_bytes()
    assert f.digest == (hashlib.sha256(data).hexdigest(), len(data))
    loaded = torch.load(tmp_path / "big.pt", weights_only=True)
    assert all(torch.equal(loaded[k], v) for k, v in state.items())
