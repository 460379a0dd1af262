"""nnU-Net v2 in an environment of its own, and its commands run there.

nnU-Net is never a dependency of `cellseg`: `dynamic-network-architectures` (which it needs) caps timm below the
version cellseg pins. The environment is a venv whose own site-packages hold nnU-Net and its needs (timm < 1.0.23
among them); a `.pth` file puts the creating interpreter's site-packages *after* them, so nnU-Net runs on the same
torch build as cellseg (a cluster's CUDA torch is not installed twice) while its own timm wins.

    python -m bench.peers.nnunet env [--env DIR] [--wheels DIR]   # create, or reuse and say so

`--wheels DIR` installs from a folder of wheels with no index (GPU nodes without internet):
`bash scripts/offline_wheels.sh --peer nnunet --dest DIR` fills it. Instead of a venv, `--env` may name a folder on
`PYTHONPATH` that already holds nnU-Net (`pip install --target`): it is used as it is.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

VERSION = "2.8.1"
REQUIREMENT = f"nnunetv2=={VERSION}"
ENV_VARIABLE = "CELLSEG_NNUNET_ENV"
BASE_PTH = "zz_cellseg_base.pth"  # sorts after nnU-Net's own .pth files: the base site-packages come last
# The command-line entry points of nnunetv2 2.8.1 (its console_scripts), run as `python -c` so that no script has to
# be on PATH (a --target install has none).
ENTRY_POINTS = {
    "plan_and_preprocess": ("nnunetv2.experiment_planning.plan_and_preprocess_entrypoints", "plan_and_preprocess_entry"),
    "train": ("nnunetv2.run.run_training", "run_training_entry"),
    "predict": ("nnunetv2.inference.predict_from_raw_data", "predict_entry_point"),
}


def default_env() -> Path:
    """`$CELLSEG_NNUNET_ENV`, else `~/.cache/cellseg/nnunet-<version>`."""
    return Path(os.environ.get(ENV_VARIABLE) or Path.home() / ".cache" / "cellseg" / f"nnunet-{VERSION}")


@dataclass(frozen=True)
class Env:
    """Where nnU-Net runs: an interpreter, and a folder to put first on `PYTHONPATH` (a `--target` install)."""

    python: Path
    path: Path | None = None

    def environ(self, extra: Mapping[str, str]) -> dict[str, str]:
        """The environment of an nnU-Net command: this one's, `extra`, and the target folder (if any) first on
        PYTHONPATH, ahead of anything that could hold cellseg's timm."""
        env = {**os.environ, **extra}
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([*([str(self.path)] if self.path else []), *paths])
        return env

    def version(self) -> str | None:
        """nnunetv2's version there (None: not installed)."""
        probe = subprocess.run([str(self.python), "-c", "import importlib.metadata as m; print(m.version('nnunetv2'))"],
                               capture_output=True, text=True, env=self.environ({}))
        return probe.stdout.strip() if probe.returncode == 0 else None

    def run(self, step: str, args: Sequence[str], extra: Mapping[str, str], *, log_file: Path,
            allow: Sequence[int] = ()) -> int:
        """Run one of nnU-Net's commands (`ENTRY_POINTS`) with `args`, its output into `log_file` and the console;
        returns its exit status (0, or one of `allow`).

        Raises:
            RuntimeError: the command failed (names the log file and its last lines).
        """
        module, func = ENTRY_POINTS[step]
        code = f"import sys; sys.argv[0] = 'nnUNetv2_{step}'; from {module} import {func}; sys.exit({func}())"
        log_file.parent.mkdir(parents=True, exist_ok=True)
        log.info("nnU-Net %s: %s", step, " ".join(args))
        with open(log_file, "a") as fh:
            proc = subprocess.Popen([str(self.python), "-c", code, *args], env=self.environ(extra),
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                fh.write(line)
                fh.flush()  # the log is live: `tail -f` shows nnU-Net's epochs as they end
                if line.strip():
                    log.debug("nnunet: %s", line.rstrip())
            code_ = proc.wait()
        if code_ != 0 and code_ not in allow:
            tail = "".join(log_file.read_text().splitlines(keepends=True)[-15:])
            raise RuntimeError(f"nnU-Net {step} failed (exit {code_}); its log is {log_file}:\n{tail}")
        return code_


def find_env(path: Path) -> Env:
    """The nnU-Net environment at `path`: a venv (`bin/python`) or a `--target` folder for this interpreter.

    Raises:
        FileNotFoundError: nothing holding nnunetv2 {VERSION} there; names the command that makes it.
    """
    python = path / "bin" / "python"
    env = Env(python) if python.is_file() else Env(Path(sys.executable), path) if (path / "nnunetv2").is_dir() else None
    found = env.version() if env else None
    if found != VERSION:
        what = f"nnunetv2 {found}" if found else "no nnunetv2"
        raise FileNotFoundError(f"{path}: {what} (need {VERSION}); make the environment with "
                                f"`python -m bench.peers.nnunet env --env {path}` (offline: add --wheels DIR)")
    return env  # type: ignore[return-value]


def create_env(path: Path, *, wheels: Path | None = None) -> Env:
    """Reuse the environment at `path`, or create it: a venv holding nnunetv2 {VERSION}, the creating interpreter's
    site-packages after its own (module docstring)."""
    try:
        env = find_env(path)
        log.info("nnU-Net environment: reusing %s (nnunetv2 %s)", path, VERSION)
        return env
    except FileNotFoundError:
        pass
    log.info("nnU-Net environment: creating %s (nnunetv2 %s%s)", path, VERSION,
             f", wheels from {wheels}" if wheels else "")
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    python = path / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / BASE_PTH).write_text(sysconfig.get_paths()["purelib"] + "\n")
    source = ["--no-index", "--find-links", str(wheels)] if wheels else []
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *source,
                    REQUIREMENT], check=True)
    return find_env(path)
