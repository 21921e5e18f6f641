"""Shared helpers for the test suite of the three PPO scripts.

Plain functions (import them with `from conftest import ...`; pytest puts this directory on sys.path):

- REPO_ROOT                      the repository root (the parent of tests/)
- script_env(**extra)            os.environ plus OMP_NUM_THREADS=1 etc., for subprocesses
- run_script(name, *args, cwd)   run `python REPO_ROOT/<name>.py args...` in cwd, return CompletedProcess
- run_scripts(jobs, max_workers) run several (name, args, cwd) jobs concurrently, results in order
- run_dirs(cwd)                  the run directories under cwd/runs, sorted
- only_run_dir(cwd)              the single run directory under cwd/runs (asserts there is exactly one)
- read_scalars(path)             {tag: [(step, value), ...]} from a run directory or one event file
- load_script(name)              import REPO_ROOT/<name>.py as a module (cached), for unit tests
- SCRIPTS                        the three training scripts' names
- main_in_process(module, args, cwd, monkeypatch, capsys)  a script's main() in this process:
                                 (exit code, stderr, stdout)

Autouse: each test file runs on one torch thread (put back after it), and every test gets the signal handlers it
started with back (a main() run in-process installs its own,
which would otherwise swallow pytest's SIGTERM and first Ctrl-C for the rest of the session).
"""

import importlib.util
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ["ppo_discrete", "ppo_continuous", "ppo_atari"]
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """main() run in this process, and the tests' own tensors, on one intra-op thread: the tiny networks are
    faster so, and much faster on a busy two-core machine. Put back after each test file."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def restore_signal_handlers_after_each_test():
    saved = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def main_in_process(module, args, cwd, monkeypatch, capsys):
    """module.main() in this process, in cwd: returns (exit code, stderr, stdout). Any exception but
    SystemExit propagates (it is what would have printed a traceback). The global settings main() changes
    (torch threads) are put back."""
    import torch

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", [Path(module.__file__).name, *map(str, args)])
    threads = torch.get_num_threads()
    capsys.readouterr()
    try:
        module.main()
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        if torch.get_num_threads() != threads:  # only where main() changed it (a test may count the calls)
            torch.set_num_threads(threads)
    captured = capsys.readouterr()
    return code, captured.err, captured.out


def script_env(**extra):
    """Environment for a script subprocess: one thread per op, headless rendering, offline wandb."""
    env = os.environ.copy()
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        WANDB_MODE="offline",
        SDL_VIDEODRIVER="dummy",
        SDL_AUDIODRIVER="dummy",
        MUJOCO_GL=env.get("MUJOCO_GL", "egl"),
    )
    env.pop("PYTHONPATH", None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _script_path(script_name):
    name = script_name if script_name.endswith(".py") else f"{script_name}.py"
    return REPO_ROOT / name


def run_script(script_name, *args, cwd, timeout=300, env=None):
    """Run one of the repository's scripts in a subprocess with `cwd` as working directory.

    `script_name` is e.g. "ppo_discrete" or "ppo_discrete.py"; `args` are converted with str().
    Never raises on a non-zero exit: the caller checks `returncode`, `stdout` and `stderr`."""
    cmd = [sys.executable, str(_script_path(script_name)), *map(str, args)]
    return subprocess.run(cmd, cwd=str(cwd), env=env or script_env(), capture_output=True, text=True,
                          timeout=timeout)


def run_scripts(jobs, max_workers=3, timeout=300):
    """Run several (script_name, args, cwd) jobs concurrently; returns their CompletedProcess in order."""
    with ThreadPoolExecutor(max_workers=max_workers) as pool:
        futures = [pool.submit(run_script, name, *args, cwd=cwd, timeout=timeout) for name, args, cwd in jobs]
        return [f.result() for f in futures]


def run_dirs(cwd):
    runs = Path(cwd) / "runs"
    return sorted(p for p in runs.iterdir() if p.is_dir()) if runs.is_dir() else []


def only_run_dir(cwd):
    dirs = run_dirs(cwd)
    assert len(dirs) == 1, f"expected exactly one run directory under {cwd}/runs, found {dirs}"
    return dirs[0]


def read_scalars(path):
    """All scalars of a TensorBoard run directory (or a single event file) as {tag: [(step, value), ...]},
    in the order TensorBoard would show them (purged/restarted steps removed)."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(path), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


_modules = {}


def load_script(script_name):
    """Import a repository script as a module (without running its main) for unit tests."""
    name = script_name[:-3] if script_name.endswith(".py") else script_name
    if name not in _modules and name in sys.modules \
            and Path(getattr(sys.modules[name], "__file__", "") or "").resolve() == _script_path(name):
        _modules[name] = sys.modules[name]
    if name not in _modules:
        spec = importlib.util.spec_from_file_location(name, _script_path(name))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        _modules[name] = module
    return _modules[name]


def video_frames(path):
    """The number of frames in the video at path."""
    import cv2  # in requirements.txt for ppo_atari.py, which resizes frames with it

    capture, count = cv2.VideoCapture(str(path)), 0
    while capture.read()[0]:
        count += 1
    return count
