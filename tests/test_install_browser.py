"""`make test`'s browser install (scripts/install-browser.sh), run against a stand-in apt-get: dependencies
only, never an upgrade of an installed package, nothing at all where it is not root or chromium is there."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "install-browser.sh"
UPGRADE = "Inst libudev1 [252.38-1~deb12u1] (252.39-1~deb12u2 Debian:12/oldstable [amd64])"
NEW = "Inst chromium (156.0.8078.108-1~deb12u1 Debian-Security:12/oldstable-security [amd64])"


def run(tmp_path: Path, simulated: str, installed: bool = False, uid: int = 0) -> tuple[list[str], str]:
    """Run the script with stand-ins for apt-get, dpkg and id; (the apt-get calls, stderr)."""
    bin_dir, log = tmp_path / "bin", tmp_path / "apt.log"
    bin_dir.mkdir(exist_ok=True)
    stand_ins = {
        "apt-get": f'echo "$*" >> {log}\ncase " $* " in *" --simulate "*) printf "%s\\n" "$FAKE_SIMULATION";; esac',
        "dpkg": f"exit {0 if installed else 1}",
        "id": f"echo {uid}",
    }
    for name, body in stand_ins.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_SIMULATION": simulated}
    done = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, check=True)
    return (log.read_text().splitlines() if log.exists() else []), done.stderr


def test_installs_dependencies_only_and_never_upgrades(tmp_path):
    calls, _ = run(tmp_path, NEW)
    assert calls[0] == "update -qq"
    simulate, install = calls[1:]
    assert simulate.endswith("--simulate") and install == simulate.removesuffix(" --simulate")
    assert "--no-install-recommends --no-upgrade" in install
    assert install.split()[-3:] == ["chromium", "fonts-wqy-zenhei", "dbus-x11"]


def test_an_install_that_would_upgrade_a_package_installs_nothing_and_says_so(tmp_path):
    calls, err = run(tmp_path, f"{NEW}\n{UPGRADE}")
    assert len(calls) == 2 and calls[1].endswith("--simulate")
    assert "would upgrade installed packages (libudev1)" in err and "apt-get install" in err


@pytest.mark.parametrize(("installed", "uid"), [(True, 0), (False, 1000)])
def test_nothing_happens_when_chromium_is_there_or_not_root(tmp_path, installed, uid):
    calls, _ = run(tmp_path, NEW, installed=installed, uid=uid)
    assert calls == []
