"""Where a number comes from: the code, software and hardware that produced it (``provenance``) and the command, as
a reader pastes it (``recorded_command``). The depth study's records and the reproduction tables carry both."""

import platform
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import List, Optional


def provenance(cpu: bool, threads: Optional[int]) -> dict:
    """What a cell's numbers depend on besides its command: the code, the software and the hardware."""
    import fairseq
    import torch

    def git(*arguments: str) -> str:
        found = subprocess.run(["git", *arguments], cwd=Path(__file__).parent, capture_output=True, text=True)
        return found.stdout.strip() if found.returncode == 0 else ""

    cpus = re.findall(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M) \
        if Path("/proc/cpuinfo").exists() else []
    device = (torch.cuda.get_device_name() if not cpu and torch.cuda.is_available()
              else cpus[0] if cpus else platform.processor() or platform.machine())
    return {"commit": git("rev-parse", "HEAD") or None,
            "uncommitted_changes": bool(git("status", "--porcelain", "--untracked-files=no")),
            "torch": torch.__version__, "fairseq": fairseq.__version__, "python": platform.python_version(),
            "device": device, "threads": threads or torch.get_num_threads()}


def recorded_command(command: List[str]) -> str:
    """``command`` as a reader pastes it where it ran (the repository root): ``python`` for this interpreter, and
    paths inside the working directory relative to it, so the record names no one machine's checkout."""
    def portable(argument: str) -> str:
        if argument == sys.executable:
            return "python"
        path = Path(argument)
        return str(path.relative_to(Path.cwd())) if path.is_absolute() and path.is_relative_to(Path.cwd()) else argument

    return shlex.join(portable(argument) for argument in command)
