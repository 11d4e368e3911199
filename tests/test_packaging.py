"""The installable package: a built wheel gives the middleware and a working ``rubric-studio``
console script outside the repository; ``rubric-studio app`` serves the app from a clone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest
from browser_support import free_port
from conftest import ROOT


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.endswith("_API_KEY") and not k.startswith(("RUBRIC_STUDIO_", "LANG"))}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project built as a wheel and installed (alone) into a fresh target directory."""
    out = tmp_path_factory.mktemp("wheel")
    # Build from a copy: an in-tree build would leave build/ and *.egg-info in the clone.
    source = out / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "*.egg-info", "artifacts", "__pycache__", ".*_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--quiet", "-w", str(out), str(source)], check=True, timeout=300,
                   cwd=out, env=_clean_env())
    [wheel] = out.glob("rubric_studio-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "rubric_core/tools/_sandbox_harness.py" in names  # read as text by the sandbox
    assert not [n for n in names if n.startswith(("tests/", "pages/", "bench/"))]
    target = out / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet",
                    "--target", str(target), str(wheel)], check=True, timeout=300,
                   env=_clean_env())
    return target


def _from_wheel(target: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = _clean_env(PYTHONPATH=str(target))
    return subprocess.run([str(target / "bin" / "rubric-studio"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_the_wheel_runs_an_example_outside_the_repository(
    installed_wheel: Path, tmp_path: Path
) -> None:
    where = subprocess.run(
        [sys.executable, "-c", "import rubric_core, sys; print(rubric_core.__file__)"],
        cwd=tmp_path, env=_clean_env(PYTHONPATH=str(installed_wheel)), capture_output=True,
        text=True, check=True, timeout=60,
    )
    assert where.stdout.strip().startswith(str(installed_wheel))
    for example in ("haiku", "find_duplicates"):  # find_duplicates runs code in the sandbox
        proc = _from_wheel(installed_wheel, "run", "--example", example, "--quiet",
                           cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "status: satisfied" in proc.stdout


def test_the_wheel_explains_that_the_app_ships_with_the_repository(
    installed_wheel: Path, tmp_path: Path
) -> None:
    proc = _from_wheel(installed_wheel, "app", cwd=tmp_path)
    assert proc.returncode == 2
    assert "ships with the repository" in proc.stderr and "Traceback" not in proc.stderr


def test_python_dash_m_is_the_same_command(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "rubric_core", "examples"], cwd=tmp_path,
                          env=_clean_env(), capture_output=True, text=True, timeout=60,
                          check=True)
    assert "haiku" in proc.stdout


def test_rubric_studio_app_serves_the_app_behind_the_host_check(tmp_path: Path) -> None:
    port = free_port()
    script = Path(sys.executable).with_name("rubric-studio")
    proc = subprocess.Popen(
        [str(script), "app", "--server.port", str(port), "--server.headless", "true"],
        cwd=tmp_path, env=_clean_env(RUBRIC_STUDIO_DB=str(tmp_path / "db.sqlite3")),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health",
                                            timeout=2) as response:
                    assert response.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None, "rubric-studio app exited"
                assert time.monotonic() < deadline, "the app did not start"
                time.sleep(0.5)
        request = urllib.request.Request(f"http://127.0.0.1:{port}/",
                                         headers={"Host": f"evil.example:{port}"})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)
        assert refused.value.code == 403
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
