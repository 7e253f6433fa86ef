"""Run `python -m pytest ...` many times without starting a new interpreter each time.

The lab checks (tests/test_lab_checks.py) run a lab's tests once per planted mistake
(`labs/mutation.py`) and twice per step: some 260 short pytest runs. A fresh process spends
one to four seconds of each before the first test: starting Python, importing torch (with
torch._dynamo, which mini_vllm pulls in), numpy and pytest, and importing hypothesis and
anyio through pytest's assert rewriting, which caches nothing when bytecode is not written.

`run_pytest(args, env=..., cwd=..., timeout=...)` gives what
`subprocess.run([sys.executable, "-m", "pytest", *args], ...)` gives, output captured.
Where `os.fork` exists it asks a server: this file run as a script, started once per
calling process, which imports those third-party modules and then, for each run, forks a
child that sets the run's own variables, runs pytest as `python -m pytest` would, and
exits. The server imports nothing from the repository, mini_vllm least of all (it checks),
so each child imports the package fresh, with that run's mutant applied by the import
hook, and nothing of one run reaches the next: a child's memory goes when it exits.
Running pytest again in one process instead would leave each mutated module, and every
module that imported it, in sys.modules; a fork starts every run from the same state.

What makes a child look like a fresh `python -m pytest`:
- The server starts with the environment the runs get, so what the imports read from it
  (OMP_NUM_THREADS: torch's thread count) is what a fresh process would read. Only the
  variables named in `per_run` (the mutant, the grade report's path) may differ between
  runs; a run whose other variables differ gets a new server.
- The server runs no torch code before forking: a fork of a process whose OpenMP threads
  have started can hang in the child. Importing torch starts none.
- pytest rewrites the asserts of its plugins' packages when it imports them, and warns when
  it finds one imported already; the server imports hypothesis and anyio through pytest's
  own rewriting hook, so the child finds them as its pytest would have left them. Modules
  whose loading has effects (the plugins' entry points, conftest files) stay out.
- sys.path, sys.argv and __main__ are those of `python -m pytest` (runpy runs pytest's
  __main__); stdin is /dev/null; stdout and stderr go to files read back after the exit;
  numpy's global generator is seeded anew, as at its import (Python's `random` reseeds
  itself after a fork). Two things differ, and no lab's outcome depends on them: a child
  sees numpy and torch._dynamo in sys.modules even when its lab would not have imported
  them, and every child has the server's string hash seed (the order of a set of strings)
  where fresh processes would each draw one.
- An exception that escapes pytest exits 1 with its traceback on stderr and a signal gives
  -signal, as for a subprocess. The child leads its own process group, which is killed when
  it runs past the timeout (`subprocess.TimeoutExpired`, with the output so far) or when
  the caller goes away.

Without `os.fork` (Windows) `run_pytest` starts a subprocess for every run.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import importlib.metadata
import json
import os
import select
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from collections.abc import Iterable, Mapping
from pathlib import Path

# Imported once by the server; everything else each child imports itself.
PRELOAD = ("numpy", "torch", "torch._dynamo", "pytest")
# Packages of pytest plugins, imported through pytest's rewriting hook. Every run imports
# hypothesis (its plugin's terminal summary does) and anyio (its plugin's module does).
PRELOAD_REWRITTEN = ("hypothesis", "anyio", "anyio._backends._asyncio")
CHILD_SETUP_FAILED = 70  # not 1: a broken runner must not pass for a caught mutant
START_TIMEOUT = 300  # seconds for the server's imports


def run_pytest(
    args: Iterable[str],
    *,
    env: Mapping[str, str],
    cwd: str | Path,
    timeout: float,
    per_run: Iterable[str] = (),
) -> subprocess.CompletedProcess:
    """`python -m pytest *args` in `cwd` with environment `env`, output captured as text.

    Raises `subprocess.TimeoutExpired` (with the output so far) after `timeout` seconds.
    `per_run` names the variables of `env` that the server's imports do not read and that
    may change from one run to the next without starting another server.
    """
    args, env, cwd = [str(a) for a in args], dict(env), str(cwd)
    if not hasattr(os, "fork"):
        cmd = [sys.executable, "-m", "pytest", *args]
        return subprocess.run(
            cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
    per_run = frozenset(per_run)
    run_env = {name: env.pop(name) for name in per_run if name in env}
    global _server
    if _server is None or not _server.serves(env, cwd, per_run):
        if _server is not None:
            _server.close()
        _server = _Server(env, cwd, per_run)
    return _server.run(args, run_env, timeout)


_server: _Server | None = None


@atexit.register
def _close_server() -> None:
    if _server is not None:
        _server.close()


class _Server:
    """The calling side: one server process, one run at a time."""

    def __init__(self, env: dict[str, str], cwd: str, per_run: frozenset[str]):
        self.env, self.cwd, self.per_run = env, cwd, per_run
        self.log = tempfile.TemporaryFile()  # the server's own stderr, shown if it fails
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
        )
        self._reply("while starting", START_TIMEOUT)  # {"ready": pid}: the imports worked

    def serves(self, env: dict[str, str], cwd: str, per_run: frozenset[str]) -> bool:
        fixed = (self.env, self.cwd, self.per_run) == (env, cwd, per_run)
        return fixed and self.proc.poll() is None

    def run(self, args: list[str], run_env: dict[str, str], timeout: float):
        request = {"args": args, "env": run_env, "timeout": timeout}
        try:
            self.proc.stdin.write(json.dumps(request).encode() + b"\n")
            self.proc.stdin.flush()
            # The server stops the run at `timeout`; the margin is for reading its output.
            reply = self._reply("during a run", timeout + 60)
        except BaseException:
            self.stop()  # interrupted or failed: its next reply would answer this run
            raise
        cmd = [sys.executable, "-m", "pytest", *args]
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired(cmd, timeout, reply["stdout"], reply["stderr"])
        return subprocess.CompletedProcess(
            cmd, reply["returncode"], reply["stdout"], reply["stderr"]
        )

    def _reply(self, when: str, timeout: float) -> dict:
        ready = select.select([self.proc.stdout], [], [], timeout)[0]
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.stop()
            self.log.seek(0)
            log = self.log.read().decode(errors="replace")[-3000:]
            state = "gave no answer" if not ready else "ended"
            raise RuntimeError(
                f"the pytest server {self.proc.args[-1]} {state} {when} "
                f"(exit {self.proc.returncode}); its stderr:\n{log}"
            )
        return json.loads(line)

    def stop(self) -> None:
        """End the server, and with it a run in progress."""
        if self.proc.poll() is None:
            self.proc.terminate()  # the server kills its child's group on the way out
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # the server exits at the end of its input
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.stop()
        self.log.close()


# --- the server -------------------------------------------------------------------------


def _serve() -> None:
    if not sys.flags.safe_path:
        # As for `python -m pytest`: the working directory comes first on sys.path, not
        # the folder of this file.
        sys.path[0] = os.getcwd()
    requests = os.fdopen(os.dup(0), "rb")
    replies = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(2, 1)  # a stray print during the imports goes to the log, not into a reply
    os.close(devnull)

    for name in PRELOAD:
        importlib.import_module(name)
    _import_rewritten(PRELOAD_REWRITTEN)
    project = _modules_from_the_repository(os.getcwd())
    if project:
        raise RuntimeError(f"the server imported {project}: a change to them would not apply")
    # Leave what was imported out of the children's garbage collections: walking it would
    # cost each child time (and copy the pages it touches) for objects that live on anyway.
    gc.collect()
    gc.freeze()

    def send(reply: dict) -> None:
        replies.write(json.dumps(reply).encode() + b"\n")
        replies.flush()

    # SIGTERM ends the server through `finally`, which kills a running child.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    channels = (requests.fileno(), replies.fileno())
    send({"ready": os.getpid()})
    for line in requests:
        send(_run_child(json.loads(line), channels))


def _import_rewritten(names: Iterable[str]) -> None:
    """Import `names` as pytest imports its plugins' packages: through its rewriting hook,
    with the asserts of every module of a plugin's distribution rewritten.

    A child's pytest then finds them loaded by a hook of its own kind, and neither rewrites
    them again nor warns that it cannot. The hook's configuration has no ini file; the
    rewriting reads enable_assertion_pass_hook from it, which the project leaves unset.
    """
    from _pytest.assertion import install_importhook
    from _pytest.config import get_config

    hook = install_importhook(get_config())
    try:
        if not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):  # else pytest marks none
            hook.mark_rewrite(*_plugin_distribution_modules())
        for name in names:
            importlib.import_module(name)
    finally:
        sys.meta_path.remove(hook)


def _plugin_distribution_modules() -> set[str]:
    """Top-level modules and packages of the installed distributions that register a pytest
    plugin: the names pytest marks for rewriting when it starts."""
    names = set()
    for dist in importlib.metadata.distributions():
        if not any(ep.group == "pytest11" for ep in dist.entry_points):
            continue
        for file in dist.files or []:
            parts = file.parts
            if len(parts) == 1 and parts[0].endswith(".py") and parts[0] != "setup.py":
                names.add(parts[0].removesuffix(".py"))
            elif len(parts) == 2 and parts[1] == "__init__.py":
                names.add(parts[0])
    return names


def _modules_from_the_repository(root: str) -> list[str]:
    installed = [sysconfig.get_paths()[key] for key in ("purelib", "platlib")]
    found = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        # This file is __main__ (multiprocessing also lists it as __mp_main__); torch.ops
        # and torch.classes are objects with a bare file name.
        if module is sys.modules["__main__"] or not path or not os.path.isabs(path):
            continue
        path = os.path.realpath(path)
        inside = path.startswith(os.path.join(os.path.realpath(root), ""))
        if inside and not any(path.startswith(os.path.realpath(p)) for p in installed):
            found.append(name)
    return found


def _run_child(request: dict, channels: tuple[int, int]) -> dict:
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(request, out.fileno(), err.fileno(), channels)  # never returns
    try:
        os.setpgid(pid, pid)  # also here, so that a kill cannot come before the child's own
    except OSError:
        pass  # the child got there first, or has exited
    try:
        returncode, timed_out = _wait(pid, request["timeout"], channels[0])
    except BaseException:  # the server is ending: take the run down with it
        _kill_group(pid)
        os.waitpid(pid, 0)
        raise
    return {
        "returncode": returncode,
        "timed_out": timed_out,
        "stdout": _read(out),
        "stderr": _read(err),
    }


def _wait(pid: int, timeout: float, requests: int) -> tuple[int | None, bool]:
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), False
        if time.monotonic() > deadline:
            _kill_group(pid)
            os.waitpid(pid, 0)
            return None, True
        # The caller sends nothing while a run is on; input now means it closed the pipe.
        if select.select([requests], [], [], 0.01)[0]:
            raise SystemExit("the caller went away")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # the child and everything it started have exited


def _read(file) -> str:
    file.seek(0)
    text = file.read().decode(errors="replace")
    file.close()
    return text


def _child(request: dict, out: int, err: int, channels: tuple[int, int]) -> None:
    try:
        os.setpgid(0, 0)
        for fd in channels:
            os.close(fd)
        os.dup2(out, 1)
        os.dup2(err, 2)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.update(request["env"])
        sys.argv = ["pytest", *request["args"]]  # runpy puts pytest's __main__.py first
        if "numpy.random" in sys.modules:
            sys.modules["numpy.random"].seed()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(CHILD_SETUP_FAILED)
    os._exit(_python_m_pytest())


def _python_m_pytest() -> int:
    """What `python -m pytest` would exit with, and what its interpreter does at exit."""
    import runpy

    try:
        runpy.run_module("pytest", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
    return code


def _exit_code(code) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    _serve()
