"""Debian packages as corpus archives: finding ``<package>_<version>_<arch>.deb`` files in --archives,
``apt-get download`` for the missing ones (or, for pinned ones, Debian's snapshot archive), and reading
files out of them without dpkg or root."""

import hashlib
import io
import os
import shutil
import subprocess
import tarfile
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence, Tuple

from deepnmt_plugin.data.archives import BROKEN_ARCHIVE_ERRORS, download_file
from deepnmt_plugin.data.pipeline import DataPrepError

# Debian's snapshot archive keeps every file Debian ever published and serves it as <base>/file/<sha1>,
# long after a stable update has replaced it on the mirrors.
SNAPSHOT_URL = "https://snapshot.debian.org"


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


@dataclass(frozen=True)
class PinnedDeb:
    """One .deb as a manifest pins it."""

    package: str
    version: str
    architecture: str
    file: str
    size: int
    sha256: str
    sha1: str

    def snapshot_url(self, base: str) -> str:
        return f"{base.rstrip('/')}/file/{self.sha1}"


def file_hashes(path: Path) -> Tuple[str, str]:
    """(sha256, sha1) of a file."""
    sha256, sha1 = hashlib.sha256(), hashlib.sha1()
    with open(path, "rb") as data:
        for chunk in iter(lambda: data.read(1 << 20), b""):
            sha256.update(chunk)
            sha1.update(chunk)
    return sha256.hexdigest(), sha1.hexdigest()


def pin_of(deb: Path) -> PinnedDeb:
    """A .deb's pin; package, version and architecture from apt-get's file name, which writes an epoch's ":" as %3a."""
    package, version, architecture = deb.name.removesuffix(".deb").split("_")
    sha256, sha1 = file_hashes(deb)
    return PinnedDeb(package, urllib.parse.unquote(version), architecture, deb.name, deb.stat().st_size, sha256, sha1)


def ensure_pinned(pins: Sequence[PinnedDeb], folder: Path, download: bool, snapshot_url: str, unpinned: bool) -> None:
    """Make ``folder`` hold each pinned .deb, its sha256 verified: from ``folder`` itself, else ``apt-get download``
    (kept where it returns the pinned file), else the snapshot archive by SHA1. A file under a pinned name with
    another sha256 is refused. With ``unpinned``, such a file, or another version of the package in ``folder`` or
    from apt-get, stands in for the pin, and is named. Raises, listing each file still missing, before anything
    is built."""
    stand_ins = []

    def at_hand(pin: PinnedDeb, where: str) -> bool:
        path = folder / pin.file
        if path.is_file():
            sha256, _ = file_hashes(path)
            if sha256 != pin.sha256 and not unpinned:
                raise DataPrepError(f"{path} has sha256 {sha256}, not the pinned {pin.sha256}: delete it to fetch "
                                    "the pinned file, or build an unpinned corpus from it with --unpinned")
            if sha256 != pin.sha256:
                stand_ins.append(f"{pin.file} ({where}) has sha256 {sha256}, not the pinned {pin.sha256}")
            return True
        other = newest_deb(folder, pin.package) if unpinned else None
        if other is not None:
            stand_ins.append(f"{other.name} ({where}) in place of the pinned {pin.file}")
        return other is not None

    lacking = [pin for pin in pins if not at_hand(pin, "in --archives")]
    failure = ""
    if lacking and download and shutil.which("apt-get"):
        print(f"downloading {' '.join(pin.package for pin in lacking)} with apt-get download ...", flush=True)
        folder.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["apt-get", "download", *(pin.package for pin in lacking)], cwd=folder,
                                capture_output=True, text=True)
        lacking = [pin for pin in lacking if not at_hand(pin, "from apt-get download")]
        if lacking:  # another version (a stable update, another release) or none: the pin comes from the snapshot
            reason = (result.stderr.strip().splitlines() or [f"exit status {result.returncode}"])[-1]
            failed = f" (it failed: {reason})" if result.returncode else ""
            print(f"apt-get download did not give the pinned {', '.join(pin.file for pin in lacking)}{failed}",
                  flush=True)
    for pin in list(lacking) if download else []:
        url = pin.snapshot_url(snapshot_url)
        try:
            fetch_pinned(url, folder / pin.file, pin)
        except OSError as error:  # URLError, HTTPError, timeouts and refused connections are all OSErrors
            failure = f"fetching {url} failed ({error}); "
            break
        print(f"{pin.file}: fetched from {url}, sha256 verified", flush=True)
        lacking.remove(pin)
    if lacking:
        listing = "\n".join(f"  {pin.file}  {pin.snapshot_url(snapshot_url)}  sha256 {pin.sha256}" for pin in lacking)
        raise DataPrepError(f"{failure}missing in {folder} (nothing was done; put these files there, or rerun where "
                            f"apt-get download or {snapshot_url} can be reached):\n{listing}")
    for stand_in in stand_ins:
        print(f"not pinned, used (--unpinned): {stand_in}", flush=True)
    print(f"{len(pins) - len(stand_ins)} of {len(pins)} .debs as pinned, sha256 verified", flush=True)


def fetch_pinned(url: str, destination: Path, pin: PinnedDeb) -> None:
    """Download ``url`` to ``destination``, which only a file with the pinned sha256 reaches."""
    unverified = destination.with_name(destination.name + ".unverified")
    download_file(url, unverified)
    sha256, _ = file_hashes(unverified)
    if sha256 != pin.sha256:
        unverified.unlink()
        raise DataPrepError(f"{url} is not {pin.file}: sha256 {sha256}, not the pinned {pin.sha256}; it was not kept")
    os.replace(unverified, destination)


def pinned_debs(pins: Sequence[PinnedDeb], folder: Path, unpinned: bool) -> List[Path]:
    """The .deb of each pin once ``ensure_pinned`` has run: the pinned file, or with ``unpinned`` its stand-in."""
    return [folder / pin.file if (folder / pin.file).is_file() or not unpinned else newest_deb(folder, pin.package)
            for pin in pins]
