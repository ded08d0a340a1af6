"""Children a driver owns (the depth sweep's and study's trainers, generate and scoring; the reproduction scripts'
trainers): each in a process group of its own, killed with the driver, by the kernel when the driver dies (kill -9
included; Linux) and by the driver when it stops on Ctrl-C or an error. An orphaned trainer trained on unlogged, and
beside a rerun of its cell in the same save-dir."""

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from typing import Callable, List

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>: the signal a process gets when the thread that started it ends
LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None
_children_lock = threading.Lock()
_children: set = set()  # the children running now, of every worker thread
_stopping = threading.Event()


class DriverStopping(Exception):
    """The driver is stopping (Ctrl-C or an error): a worker thread starts no child, and one whose child the driver
    killed has no outcome to report (a killed trainer is no crash); the driver ends on its own exception."""


def _die_with(parent: int):
    """What the child runs between fork and exec: SIGKILL when its parent dies; if that happened already, exit now."""
    def preexec():
        LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)
    return preexec


@contextlib.contextmanager
def owned_process(command: List[str], **popen_arguments):
    """``command`` started as the driver's own (module docstring): in a process group of its own, with the DataLoader
    workers it forks; killed when the ``with`` block is left by an exception, or by ``children_stop_with_driver``, after
    which the block's end raises DriverStopping, as does a start while the driver is stopping."""
    with _children_lock:
        if _stopping.is_set():
            raise DriverStopping("the driver is stopping: no new process")
        process = subprocess.Popen(command, start_new_session=True,
                                   preexec_fn=_die_with(os.getpid()) if LIBC else None, **popen_arguments)
        _children.add(process)
    try:
        yield process
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        raise
    finally:
        with _children_lock:
            _children.discard(process)
    if _stopping.is_set():
        raise DriverStopping(f"the driver is stopping: {command[0]} killed")


def run_owned(command: List[str], check: bool = False, **popen_arguments) -> int:
    """``subprocess.run`` for an ``owned_process``: its exit status (``check``: CalledProcessError if not 0)."""
    with owned_process(command, **popen_arguments) as process:
        returncode = process.wait()
    if check and returncode:
        raise subprocess.CalledProcessError(returncode, command)
    return returncode


@contextlib.contextmanager
def children_stop_with_driver():
    """Around a driver's pool of cells: on Ctrl-C or an error, kill every running child's process group and start no
    other, so that the pool's shutdown does not wait for trainings nobody will read."""
    _stopping.clear()
    try:
        yield
    except BaseException:
        with _children_lock:
            _stopping.set()
            running = list(_children)
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        raise


def silence_closed_stdout() -> None:
    """After a BrokenPipeError (the reader of stdout went away, ``| head``): stdout to /dev/null, or Python's flush at
    exit fails again, with a second traceback."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def stop_on_ctrl_c(main: Callable[[], int]) -> int:
    """Runs a driver's ``main``: Ctrl-C raises KeyboardInterrupt in it, which kills its children, even where it was
    started with SIGINT ignored (a shell's background job; Python then keeps it ignored, and the driver would never
    stop). The driver then ends with one line instead of a traceback, and the shell's status for SIGINT. A driver whose
    output's reader went away (``| head``) stops the same way, with the status for SIGPIPE."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return main()
    except KeyboardInterrupt:
        print("deepnmt: stopped by Ctrl-C; the same command resumes where it stopped", file=sys.stderr, flush=True)
        return 128 + signal.SIGINT
    except BrokenPipeError:
        silence_closed_stdout()
        print("deepnmt: stopped: the reader of its output closed it (| head?); the same command resumes where it "
              "stopped", file=sys.stderr, flush=True)
        return 128 + signal.SIGPIPE
