"""Let ``sacrebleu -t wmt14/full`` (and ``-t wmt17``) work offline, from the test archive on disk.

sacreBLEU keeps each test set under ``$SACREBLEU/<name>/raw`` (default ``~/.sacrebleu``): when the
tarball it would download is already there and non-empty it skips the download, and it reads the raw
files unpacked beside it. So the archive is unpacked there first and copied in last, its presence
marking the cache complete.
"""

import os
import shutil
import tarfile
from pathlib import Path

from deepnmt_plugin.data.archives import BROKEN_ARCHIVE_ERRORS, first_line
from deepnmt_plugin.data.pipeline import DataPrepError


def populate(test_set: str, langpair: str, archive: Path) -> str:
    from sacrebleu.dataset import DATASETS  # honours $SACREBLEU, read when sacrebleu is imported

    dataset = DATASETS[test_set]
    raw_dir = Path(dataset._rawdir)
    tarball = raw_dir / dataset._get_tarball_filename(dataset.data[0])  # what maybe_download() checks
    if tarball.is_file() and tarball.stat().st_size > 0:
        return f"{test_set} already in sacreBLEU's cache {raw_dir.parent}"
    raw_dir.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            names = {member.name.removeprefix("./") for member in tar}
            needed = [name for name in dataset.langpairs[langpair] if name not in names]
            if needed:
                raise DataPrepError(f"{archive} lacks {', '.join(needed)}: not the {test_set} test archive")
            tar.extractall(raw_dir, filter="data")
    except BROKEN_ARCHIVE_ERRORS as error:
        raise DataPrepError(f"{archive} is corrupt or not a tar archive ({first_line(error)})") from error
    partial = tarball.with_name(tarball.name + ".partial")
    shutil.copyfile(archive, partial)
    os.replace(partial, tarball)
    return f"{test_set} {langpair} cached in {raw_dir.parent}"
