"""The original corpus archives: finding them in --archives, downloading the missing ones, unpacking."""

import gzip
import lzma
import os
import shutil
import tarfile
import time
import urllib.request
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence, Tuple

from deepnmt_plugin.data.pipeline import DataPrepError

# Raised by tarfile on a truncated, corrupt or non-tar file (gzip and xz errors come through unwrapped).
BROKEN_ARCHIVE_ERRORS = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)


def first_line(error: Exception) -> str:
    """tarfile explains a failed "r:*" open over several lines, one per compression tried."""
    return (str(error).splitlines() or [type(error).__name__])[0].rstrip(":")


@dataclass(frozen=True)
class Archive:
    name: str  # the file name it is published under, looked for in --archives
    url: str
    members: Sequence[str] = ()  # the files the recipe reads from it
    # The members are gzipped files (giga-fren's *.gz inside a plain tar): unpacked decompressed, under their
    # names less ".gz", as the recipe's "tar xvf" then "gunzip" leaves them.
    gunzip: bool = False

    @property
    def unpacked(self) -> Tuple[str, ...]:
        """The members' names once unpacked (relative to the unpacking folder)."""
        return tuple(member.removesuffix(".gz") if self.gunzip else member for member in self.members)


def ensure_archives(archives: Sequence[Archive], folder: Path, download: bool) -> None:
    """Download what is missing from ``folder`` (when allowed); raise, listing each file still missing
    with its URL, before anything else is done."""
    missing = [archive for archive in archives if not (folder / archive.name).is_file()]
    failure = ""
    for archive in list(missing) if download else []:
        print(f"downloading {archive.url} ...", flush=True)
        try:
            download_file(archive.url, folder / archive.name)
        except OSError as error:  # URLError, timeouts and refused connections are all OSErrors
            failure = f"downloading {archive.url} failed ({error}); "
            break
        missing.remove(archive)
    if missing:
        listing = "".join(f"\n  {archive.name}  {archive.url}" for archive in missing)
        raise DataPrepError(
            f"{failure}missing in {folder} (nothing was done; put them there under these names, "
            f"or rerun where the network allows):{listing}"
        )


# A download slower than MIN_BYTES_PER_SECOND over any RATE_WINDOW seconds is given up (a per-read timeout alone
# lets a server that sends a byte a minute hold data-prep forever); one progress line every PROGRESS_SECONDS.
MIN_BYTES_PER_SECOND = 1024
RATE_WINDOW = 60.0
PROGRESS_SECONDS = 10.0


def download_file(url: str, destination: Path) -> None:
    """``url`` to ``destination`` (written under a temporary name until it is whole), with a progress line every
    PROGRESS_SECONDS; a TimeoutError (an OSError, as urllib's) where it stays below MIN_BYTES_PER_SECOND."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    partial = destination.with_name(destination.name + ".partial")
    try:
        with urllib.request.urlopen(url, timeout=RATE_WINDOW) as response, open(partial, "wb") as out:
            size = response.headers.get("Content-Length")
            of = f" of {int(size) / 2**20:.1f}" if size and size.isdigit() else ""
            done, window_start, window_done, last_shown = 0, time.monotonic(), 0, time.monotonic()
            while chunk := response.read1(1 << 20):  # what has arrived: read() would wait for a whole MiB
                out.write(chunk)
                done += len(chunk)
                now = time.monotonic()
                if now - window_start >= RATE_WINDOW:
                    if done - window_done < MIN_BYTES_PER_SECOND * (now - window_start):
                        raise TimeoutError(f"{(done - window_done) / (now - window_start):.0f} bytes/s over the last "
                                           f"{now - window_start:.0f} s, below {MIN_BYTES_PER_SECOND} bytes/s")
                    window_start, window_done = now, done
                if now - last_shown >= PROGRESS_SECONDS:
                    print(f"  {destination.name}: {done / 2**20:.1f}{of} MiB", flush=True)
                    last_shown = now
        os.replace(partial, destination)
    finally:
        partial.unlink(missing_ok=True)


def unpack_members(
    archive_path: Path, members: Sequence[str], destinations: Sequence[Path], gunzip: bool = False
) -> str:
    """Copy the named files out of a tarball (names as listed by ``tar t``, a leading "./" ignored),
    decompressing each on the way when they are gzipped files (``gunzip``)."""
    wanted = dict(zip(members, destinations))
    try:
        with tarfile.open(archive_path, "r:*") as tar:
            for member in tar:
                destination = wanted.get(member.name.removeprefix("./"))
                if destination is not None and member.isfile():
                    with tar.extractfile(member) as packed, open(destination, "wb") as target:
                        source = gzip.GzipFile(fileobj=packed) if gunzip else packed
                        shutil.copyfileobj(source, target, 1 << 20)
                    del wanted[member.name.removeprefix("./")]
                    if not wanted:
                        break
    except BROKEN_ARCHIVE_ERRORS as error:
        contents = " of gzipped files" if gunzip else ""
        raise DataPrepError(
            f"{archive_path} is corrupt or not a tar archive{contents} ({first_line(error)})"
        ) from error
    if wanted:
        raise DataPrepError(f"{archive_path} lacks {', '.join(wanted)}: not the archive this recipe expects")
    return f"{len(members)} files"
