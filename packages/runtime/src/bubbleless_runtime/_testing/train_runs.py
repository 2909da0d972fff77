"""Private test helpers: ``bubbleless train`` in a fresh interpreter, and stopping one by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def run_pool_fresh(tmp_path: Path, yaml_text: str, *args: str, name: str = "run", after: str = "",
                   timeout: float = 300) -> tuple[list[float], str]:
    """``bubbleless train`` through the CLI's own path (config, ``run_pool``) in a fresh interpreter: the
    run's per-step losses at full precision and its stdout. ``after``: code run before the config is read
    (patches, say)."""
    config = tmp_path / f"{name}.yaml"
    config.write_text(yaml_text)
    argv = ["train", str(config), "--output-dir", str(tmp_path / name), *args]
    code = (
        "import json, sys\n"
        "import bubbleless_runtime.cli as cli\n"
        f"{after}"
        f"config = cli.resolve_config(cli.build_parser().parse_args({argv!r}))\n"
        "result = cli.run_pool(config)\n"
        "print('LOSSES', json.dumps(result.losses))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **_ENV}, timeout=timeout)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    line = next(line for line in done.stdout.splitlines() if line.startswith("LOSSES"))
    return json.loads(line.split(" ", 1)[1]), done.stdout


def sigterm_after_first_checkpoint(tmp_path: Path, yaml_text: str, *, wait: float = 240) -> tuple[int, Path, str]:
    """Start ``bubbleless train`` on ``yaml_text`` into ``tmp_path/out``, send SIGTERM once its first
    checkpoint exists, and check it stopped as promised (exit 143, the stop and the checkpoint said).
    The step it stopped after, the output directory and its stderr."""
    config = tmp_path / "run.yaml"
    config.write_text(yaml_text)
    out = tmp_path / "out"
    command = [sys.executable, "-c", "from bubbleless_runtime.cli import main; raise SystemExit(main())", "train",
               str(config), "--output-dir", str(out)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **_ENV})
    end = time.monotonic() + wait
    while not (out / "latest").exists() and time.monotonic() < end and proc.poll() is None:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "bubbleless: stopped by SIGTERM after step" in err and "checkpoint saved at" in err, err[-3000:]
    return int(err.split("stopped by SIGTERM after step ")[1].split()[0]), out, err
