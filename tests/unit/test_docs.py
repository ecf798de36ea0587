"""The configuration reference is generated from the settings: it must not drift from them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_configuration_reference_matches_the_settings() -> None:
    proc = subprocess.run([sys.executable, "docs/gen_config_reference.py", "--check"], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)  # a hang guard
    assert proc.returncode == 0, f"run `python docs/gen_config_reference.py --write`:\n{proc.stdout}{proc.stderr}"


def test_topology_names_cover_every_bucket(tmp_path: Path) -> None:
    from shared.subjects import Subjects, topology_stream_names

    names = topology_stream_names(Subjects("ftbus"))
    assert "KV_ftbus_status" in names and "OBJ_ftbus_private" in names and "KV_ftbus_results_bench" in names
    assert len(names) == len(set(names))
