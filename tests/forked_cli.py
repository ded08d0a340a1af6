"""Commands (``fairseq-train …``, ``python -m …``) run in processes forked from one that imported torch and fairseq.

A fresh ``fairseq-train`` spends about 4 CPU-seconds importing torch and every fairseq task (scikit-learn and scipy
among them) before it reads an argument, and the tests start a few hundred. Here one server per test worker imports
them once and forks a child per command. The child takes the command's argv, working directory, environment, stdin,
stdout and stderr, runs the console script's file, the ``-c`` code or the ``-m`` module as ``__main__`` as the
interpreter does, and its exit status comes back as a subprocess's would (negative: killed by that signal).

A fresh process differs in what the imports leave behind, and the child puts it back: the root logger (fairseq-train
configures it before importing fairseq; fairseq's wav2vec classification model configures it on import otherwise),
the Python and NumPy random states, the warning filters PYTHONWARNINGS adds, torch's thread count from
OMP_NUM_THREADS, sys.argv and sys.path[0], a traceback's first frames. What stays shared: the hash seed (one per
server). ``tests/test_forked_cli.py`` compares both ways of running.

Run as ``python forked_cli.py FD``: serves JSON requests, one a line, on the socket FD until it closes.
"""

import atexit
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

# torch._dynamo too: torch.optim.Optimizer imports it on first use, about a CPU-second in every fairseq-train
PRELOADED = ("torch", "torch._dynamo", "fairseq", "fairseq.checkpoint_utils", "fairseq.criterions", "fairseq.models",
             "fairseq.options", "fairseq.sequence_generator", "fairseq.tasks", "fairseq.trainer")


def serve(connection: socket.socket) -> None:
    import importlib
    import logging
    import warnings

    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    startup_filters = len(warnings.filters)  # the interpreter's defaults: the server runs without PYTHONWARNINGS
    for module in PRELOADED:
        importlib.import_module(module)
    configured_on_import = root.handlers[:], root.level
    root.handlers[:] = handlers
    root.setLevel(level)

    replies = connection.makefile("w")
    for line in connection.makefile("r"):
        pid = os.fork()
        if pid == 0:
            os.close(connection.detach())
            run_child(json.loads(line), configured_on_import, startup_filters)
        print(pid, file=replies, flush=True)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), file=replies, flush=True)


def run_child(request: dict, configured_on_import, startup_filters: int) -> None:
    """Become ``request['command']`` (a console script, ``python -c CODE …`` or ``python -m MODULE …``); never
    returns."""
    import random
    import runpy
    import types
    import warnings

    import numpy
    import torch

    status, command, entry = 1, request["command"], None
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        for fd, path, flags in ((0, request["stdin"], os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                                (2, request["stderr"], os.O_WRONLY)):
            opened = os.open(path, flags)
            os.dup2(opened, fd)
            os.close(opened)
        random.seed()
        numpy.random.seed()
        sys.warnoptions[:] = [option for option in os.environ.get("PYTHONWARNINGS", "").split(",") if option]
        if sys.warnoptions:  # a fresh process puts them before the defaults, and the imports' own filters before them
            added_by_imports = warnings.filters[:len(warnings.filters) - startup_filters]
            del warnings.filters[:len(added_by_imports)]
            warnings._processoptions(sys.warnoptions)
            warnings.filters[:0] = added_by_imports
            warnings._filters_mutated()
        if "OMP_NUM_THREADS" in os.environ:
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        configure_logging_when_fairseq_is_imported(configured_on_import)
        if command[0] != sys.executable:  # a console script: sys.exit(main())
            sys.argv, sys.path[0], entry = command, os.path.dirname(command[0]), command[0]
            runpy.run_path(command[0], run_name="__main__")
        elif command[1] == "-c":
            sys.argv, sys.path[0], entry = ["-c", *command[3:]], "", "<string>"
            main = sys.modules["__main__"] = types.ModuleType("__main__")
            exec(compile(command[2], "<string>", "exec"), main.__dict__)
        else:
            assert command[1] == "-m", command
            sys.argv, sys.path[0], entry = ["-m", *command[3:]], os.getcwd(), "_run_module_as_main"
            runpy._run_module_as_main(command[2])
        status = 0
    except SystemExit as stop:
        status = exit_status(stop.code)
    except BaseException as error:
        frames = error.__traceback__  # from the command's first frame on, as the interpreter prints it
        while frames is not None and entry not in (frames.tb_frame.f_code.co_filename, frames.tb_frame.f_code.co_name):
            frames = frames.tb_next
        sys.excepthook(type(error), error.with_traceback(frames), frames)
        status = 1
    finally:
        try:
            threading._shutdown()  # as the interpreter does at exit: wait for non-daemon threads, then atexit
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)


def configure_logging_when_fairseq_is_imported(configured_on_import) -> None:
    """Importing fairseq configures the root logger (``logging.basicConfig`` in its wav2vec classification model),
    unless the importer has configured it first, as fairseq-train has: do that where the tool first imports fairseq."""
    import builtins
    import logging

    fresh_import = builtins.__import__

    def first_import(name, *args, **kwargs):
        if name == "fairseq" or name.startswith("fairseq."):
            builtins.__import__ = fresh_import
            root = logging.getLogger()
            if not root.handlers:
                handlers, level = configured_on_import
                root.handlers[:] = handlers
                root.setLevel(level)
        return fresh_import(name, *args, **kwargs)

    builtins.__import__ = first_import


def exit_status(code) -> int:
    """What the interpreter exits with for ``sys.exit(code)``."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


class ForkServer:
    """The client side: one server process, started on first use, commands one at a time."""

    def __init__(self):
        self.lock = threading.Lock()
        self.server = None

    def start(self) -> None:
        self.connection, theirs = socket.socketpair()
        self.server = subprocess.Popen(
            [sys.executable, __file__, str(theirs.fileno())], pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            env={name: value for name, value in os.environ.items() if name != "PYTHONWARNINGS"},
        )
        theirs.close()
        self.received = b""
        self.folder = Path(tempfile.mkdtemp(prefix="forked-cli-"))
        atexit.register(shutil.rmtree, self.folder, ignore_errors=True)

    def run(self, command, cwd=None, input=None, env=None, timeout=None, text=True) -> subprocess.CompletedProcess:
        """``subprocess.run(command, capture_output=True, …)`` for a console script, ``python -c`` or
        ``python -m``."""
        command = list(map(str, command))
        with self.lock:
            if self.server is None or self.server.poll() is not None:
                self.start()
            paths = {name: self.folder / name for name in ("stdin", "stdout", "stderr")}
            paths["stdin"].write_bytes(input.encode() if isinstance(input, str) else input or b"")
            for name in ("stdout", "stderr"):
                paths[name].write_bytes(b"")
            request = {"command": command, "cwd": str(cwd or os.getcwd()),
                       "env": dict(env if env is not None else os.environ), **{k: str(p) for k, p in paths.items()}}
            self.connection.sendall((json.dumps(request) + "\n").encode())
            pid = self.reply(None)
            try:
                returncode = self.reply(timeout)
            except subprocess.TimeoutExpired:
                os.kill(pid, 9)
                self.reply(None)
                raise subprocess.TimeoutExpired(command, timeout) from None
            read = (lambda path: path.read_text()) if text else (lambda path: path.read_bytes())
            return subprocess.CompletedProcess(command, returncode, read(paths["stdout"]), read(paths["stderr"]))

    def reply(self, timeout) -> int:
        """The server's next line: a child's pid, then its exit status."""
        while b"\n" not in self.received:
            if not select.select([self.connection], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired("", timeout)
            chunk = self.connection.recv(4096)
            if not chunk:
                raise RuntimeError(f"the fork server stopped (status {self.server.wait()})")
            self.received += chunk
        line, self.received = self.received.split(b"\n", 1)
        return int(line)


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))
