"""The isolation tests can fail: with the policies dropped, every one of them does."""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_isolation_test_fails_when_the_policies_are_dropped(tmp_path):
    report = tmp_path / "report.xml"
    env = {
        **os.environ,
        "DIO_TEST_DB": os.environ.get("DIO_TEST_DB", "dio_test") + "_sensitivity",
        "DIO_TEST_DROP_POLICIES": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={report}",
            "tests/tenancy/test_isolation.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    cases = ET.parse(report).getroot().iter("testcase")
    outcomes = {
        case.get("name"): case.find("failure") is not None or case.find("error") is not None
        for case in cases
    }
    assert len(outcomes) >= 10
    passed_without_policies = sorted(name for name, failed in outcomes.items() if not failed)
    assert passed_without_policies == [], "these tests do not depend on the policies"
