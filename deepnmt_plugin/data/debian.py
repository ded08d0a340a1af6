"""Debian packages as corpus archives: finding ``<package>_<version>_<arch>.deb`` files in --archives,
``apt-get download`` for the missing ones, and reading files out of them without dpkg or root."""

import io
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Tuple

from deepnmt_plugin.data.archives import BROKEN_ARCHIVE_ERRORS
from deepnmt_plugin.data.pipeline import DataPrepError


def newest_deb(folder: Path, package: str) -> Optional[Path]:
    packages = sorted(folder.glob(f"{package}_*.deb"))
    return packages[-1] if packages else None


def download_missing(packages: Sequence[str], folder: Path, download: bool, how_else: str) -> None:
    """``apt-get download`` every package with no .deb in ``folder``; raises, naming each, if any stays missing."""
    missing = [package for package in packages if newest_deb(folder, package) is None]
    failure = ""
    if missing and download and shutil.which("apt-get"):
        print(f"downloading {' '.join(missing)} with apt-get download ...", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["apt-get", "download", *missing], cwd=folder, capture_output=True, text=True)
        missing = [package for package in missing if newest_deb(folder, package) is None]
        reason = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
        failure = f"apt-get download failed ({reason}); " if missing else ""
    if missing:
        listing = "\n".join(f"  {package}_<version>_<arch>.deb  (https://packages.debian.org/{package})"
                            for package in missing)
        raise DataPrepError(f"{failure}missing in {folder} (nothing was done; put them there with "
                            f"`apt-get download {' '.join(missing)}`{how_else}, or rerun where apt-get can "
                            f"download):\n{listing}")


def deb_data_files(deb: Path, wanted: Callable[[str], bool]) -> Iterator[Tuple[str, bytes]]:
    """(path, content) of each regular file of a .deb's data.tar.{xz,gz,bz2} whose path (no leading ./)
    is ``wanted``: a .deb is an ar archive (debian-binary, control.tar.*, data.tar.*)."""
    data = deb.read_bytes()
    offset = 8  # after the "!<arch>\n" magic; each member is a 60-byte header, the data, padding to even
    try:
        if not data.startswith(b"!<arch>\n"):
            raise ValueError("no ar header")
        while offset + 60 <= len(data):
            header = data[offset : offset + 60]
            name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
            if name.startswith("data.tar"):
                body = data[offset + 60 : offset + 60 + size]
                with tarfile.open(fileobj=io.BytesIO(body), mode="r:*") as tar:
                    for entry in tar:
                        path = entry.name.removeprefix("./")
                        if entry.isfile() and wanted(path):
                            yield path, tar.extractfile(entry).read()
                return
            offset += 60 + size + size % 2
        raise ValueError("no data.tar member")
    except (ValueError, UnicodeDecodeError, *BROKEN_ARCHIVE_ERRORS) as error:
        raise DataPrepError(f"{deb} is corrupt or not a .deb Python can read ({error}); "
                            f"download it again, or check it with `dpkg-deb -c {deb}`") from error
