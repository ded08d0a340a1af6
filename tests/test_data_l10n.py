"""data-prep/prepare-l10n-de-en.sh: the depth study's corpus from Debian packages' German gettext catalogs,
built offline from fixture .debs in the exact layout (ar of debian-binary, control.tar.xz, data.tar.xz).

The fixture .debs are not the versions data-prep/l10n-de-en.manifest.json pins, so the module's corpus is
built with --unpinned; a manifest of its own then pins it for the tests of pinning (--manifest), which
fetch pinned .debs from a local HTTP server standing in for snapshot.debian.org: no test reaches the internet."""

import hashlib
import json
import sys
import zlib

import pytest
from data_fixtures import binarized, mo_catalog, path_folder, read, run_script, snapshot_server, write_deb

from deepnmt_plugin.data import l10n

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

GENERATED = {f"Open image {n}": f"Bild {n} öffnen" for n in range(1, 201)}  # enough for both held-out splits
FIRST = {  # in the first package: each message exercises one rule
    "": "",  # no catalog entry: the header is written by mo_catalog
    "menu\x04_Save As…": "Speichern _unter …",  # context dropped, GTK mnemonics removed on both sides
    "&Quit": "&Beenden",  # Qt/KDE mnemonic
    "~Insert  Table": "Tabelle ~einfügen",  # LibreOffice mnemonic; whitespace collapsed
    "Fish &amp; Chips": "Fisch &amp; Pommes",  # an entity is not a mnemonic
    "one file\x00%d files": "eine Datei\x00%d Dateien",  # plural: the singular pair
    "OK": "OK",  # untranslated: dropped
    "%s: %d": "%s: %d",  # no letter: dropped
    "Layer": "Ebene",
    **GENERATED,
}
SECOND = {"Plane": "Ebene", "Brush": "Pinsel"}  # "Ebene" again: the first package's translation wins


def write_packages(folder):
    for number, package in enumerate(l10n.PACKAGES):
        messages = FIRST if number == 0 else SECOND if number == 1 else {f"Item {number}": f"Eintrag {number}"}
        messages = {key: value for key, value in messages.items() if key}
        domain = package.split("-")[0]
        prefix = "usr/lib/libreoffice/program/resource" if number == 1 else "usr/share/locale"
        files = {f"{prefix}/de/LC_MESSAGES/{domain}.mo": mo_catalog(messages),
                 f"{prefix}/fr/LC_MESSAGES/{domain}.mo": mo_catalog({"Layer": "Calque"}),  # not German: ignored
                 f"usr/share/doc/{package}/copyright": b"Format: ...\n"}
        write_deb(folder, package, "1.0-1", files, architecture="amd64" if package == "git" else "all")



@pytest.fixture(scope="module")
def l10n_corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("l10n")
    write_packages(root / "archives")
    result = run_script("prepare-l10n-de-en.sh", "--archives", root / "archives", "--output", root / "out",
                        "--bpe-ops", "60", "--unpinned")
    assert result.returncode == 0, result.stderr
    return root / "out", result


@pytest.fixture(scope="module")
def pinned(l10n_corpus):
    """A manifest pinning the fixture corpus, as ``l10n.pin`` writes one; its pins; the pinned .debs by SHA1."""
    out, _ = l10n_corpus
    manifest = out.parent / "fixture.manifest.json"
    l10n.pin(out, manifest)
    pins = l10n.read_manifest(manifest)["pins"]
    return manifest, pins, {pin.sha1: (out.parent / "archives" / pin.file).read_bytes() for pin in pins}


def pinned_archives(folder, pinned, leave_out=()):
    """FOLDER holding the pinned .debs, less those of the packages in LEAVE_OUT."""
    _, pins, debs = pinned
    folder.mkdir()
    for pin in pins:
        if pin.package not in leave_out:
            (folder / pin.file).write_bytes(debs[pin.sha1])
    return folder


def pins_of(pinned, *packages):
    return [pin for pin in pinned[1] if pin.package in packages]


def test_ui_text_rules():
    assert l10n.ui_text("menu\x04_Save As…") == "Save As…"
    assert l10n.ui_text("Gl_eichung anzeigen") == "Gleichung anzeigen"
    assert l10n.ui_text("&Quit") == "Quit" and l10n.ui_text("Tabelle ~einfügen") == "Tabelle einfügen"
    assert l10n.ui_text("-client_name and a_b") == "-client_name and a_b"  # two markers: none is a mnemonic
    assert l10n.ui_text("-client_name") == "-clientname"  # one marker before a letter reads as a mnemonic
    assert l10n.ui_text("Fish &amp; Chips") == "Fish &amp; Chips" and l10n.ui_text("a && b") == "a && b"
    assert l10n.ui_text(" two\n lines\t") == "two lines"


def test_pairs_splits_and_counts(l10n_corpus):
    out, result = l10n_corpus
    tmp = out / "tmp"
    splits = {split: list(zip(read(tmp / f"{split}.raw.de"), read(tmp / f"{split}.raw.en")))
              for split in ("train", "valid", "test")}
    train = splits["train"]
    everything = [pair for pairs in splits.values() for pair in pairs]
    for pair in [("Speichern unter …", "Save As…"), ("Beenden", "Quit"), ("Tabelle einfügen", "Insert Table"),
                 ("Fisch &amp; Pommes", "Fish &amp; Chips"), ("eine Datei", "one file"), ("Ebene", "Layer"),
                 ("Pinsel", "Brush"), ("Eintrag 5", "Item 5")]:
        assert pair in everything
    germans = [german for german, _ in everything]
    assert len(germans) == len(set(germans))  # once per German text, the first package's ("Layer", not "Plane")
    assert ("Ebene", "Plane") not in everything and not {"OK", "%s: %d", "Calque"} & set(germans)
    for split, pairs in splits.items():  # the split is the hash rule's, so a message never crosses it
        assert all(l10n.held_out_split(german) == split for german, _ in pairs)
    held_out = {german for split in ("valid", "test") for german, _ in splits[split]}
    assert held_out and not held_out & {german for german, _ in train}
    assert len(splits["test"]) == sum(zlib.crc32(g.encode()) % 50 == 0 for g in germans)
    assert len(everything) == 200 + 6 + 1 + 12  # generated, the first package's kept rules, "Pinsel", 12 others
    extract = next(line for line in result.stdout.splitlines() if line.startswith("[1/17]"))
    assert extract.startswith("[1/17] extract the German catalogs of 14 packages ... 222 messages of audacity-data_1.0-1_all.deb")
    line = read(tmp / "train.raw.de").index("Speichern unter …")
    assert read(tmp / "train.tok.de")[line] == "speichern unter ..."  # Moses normalization and lowercasing, as IWSLT
    assert binarized(out / "data-bin", "train", "de-en", "en") == read(out / "train.en")
    readme = (out / "README").read_text()
    assert "libreoffice-l10n-de MPL-2.0" in readme and "principal one of each package" in readme and "CRC-32 of the German text modulo 50" in readme


def test_other_debs_build_an_unpinned_corpus_only_with_the_flag_and_it_says_so(l10n_corpus, tmp_path):
    out, result = l10n_corpus
    stdout = result.stdout.splitlines()
    assert ("not pinned, used (--unpinned): audacity-data_1.0-1_all.deb (in --archives) in place of the pinned "
            "audacity-data_3.2.4+dfsg-1_all.deb") in stdout
    assert "0 of 14 .debs as pinned, sha256 verified" in stdout
    checksum, is_pinned = l10n.corpus_checksum(out)
    stamp = json.loads((out / "corpus.json").read_text())
    assert not is_pinned and (stamp["checksum"], stamp["pinned"]) == (checksum, False)
    assert stamp["pinned_checksum"] == l10n.read_manifest(l10n.MANIFEST)["checksum"] != checksum
    assert stamp["debs"][4]["file"] == "git_1.0-1_amd64.deb" and stamp["debs"][4]["version"] == "1.0-1"
    readme = read(out / "README")
    assert readme[0].endswith("built by deepnmt's data-prep (l10n-de-en).")  # where serving.py reads the recipe
    assert readme[1] == (f"UNPINNED CORPUS (built with --unpinned): checksum {checksum}, not the pinned "
                         f"{stamp['pinned_checksum']} of {l10n.MANIFEST}; corpus.json lists the .debs it was built from.")

    result = run_script("prepare-l10n-de-en.sh", "--archives", out.parent / "archives", "--output", tmp_path / "out",
                        "--bpe-ops", "60")
    assert result.returncode == 1
    assert result.stderr.splitlines()[0] == ("deepnmt: error: --bpe subword-nmt --bpe-ops 60 build another corpus than "
                                             f"the pinned one (--bpe subword-nmt --bpe-ops 2000, {l10n.MANIFEST}): build "
                                             "it with --unpinned, marked as unpinned")
    result = run_script("prepare-l10n-de-en.sh", "--archives", out.parent / "archives", "--output", tmp_path / "out")
    assert result.returncode == 1
    assert result.stderr.startswith(f"deepnmt: error: missing in {out.parent / 'archives'} (nothing was done")
    git = l10n.read_manifest(l10n.MANIFEST)["pins"][4]
    assert f"  {git.file}  https://snapshot.debian.org/file/{git.sha1}  sha256 {git.sha256}" in result.stderr.splitlines()
    assert not (tmp_path / "out").exists()


def test_pinned_debs_are_fetched_from_the_snapshot_archive_where_apt_get_is_absent(l10n_corpus, pinned, tmp_path):
    manifest = pinned[0]
    archives = pinned_archives(tmp_path / "archives", pinned, leave_out=("gimp-data", "git"))
    no_apt_get = {"PATH": str(path_folder(tmp_path / "bin"))}
    with snapshot_server(pinned[2]) as (url, requested):
        result = run_script("prepare-l10n-de-en.sh", "--archives", archives, "--output", tmp_path / "out", "--bpe-ops", "60",
                            "--manifest", manifest, "--snapshot-url", url, env=no_apt_get, download=True)
    assert result.returncode == 0, result.stderr
    fetched = pins_of(pinned, "gimp-data", "git")
    assert requested == [f"/file/{pin.sha1}" for pin in fetched]
    stdout = result.stdout.splitlines()
    assert stdout[:3] == [f"{pin.file}: fetched from {url}/file/{pin.sha1}, sha256 verified" for pin in fetched] + [
        "14 of 14 .debs as pinned, sha256 verified"]
    checksum, is_pinned = l10n.corpus_checksum(tmp_path / "out", manifest)
    assert is_pinned and checksum == json.loads(manifest.read_text())["checksum"]
    assert [read(tmp_path / "out" / name) for name in l10n.TEXTS] == [read(l10n_corpus[0] / name) for name in l10n.TEXTS]
    assert json.loads((tmp_path / "out" / "corpus.json").read_text())["pinned"] is True
    assert read(tmp_path / "out" / "README")[1] == f"Corpus checksum {checksum}: the pinned one ({manifest})."


def test_what_apt_get_download_returns_is_verified(pinned, tmp_path):
    """A fake apt-get returns the pinned gimp-data, another version of git and no vlc-l10n: the pins of the last
    two are fetched from the snapshot archive, which lacks vlc-l10n's, so the run stops with nothing built."""
    manifest, pins, debs = pinned
    gimp, git, vlc = pins_of(pinned, "gimp-data", "git", "vlc-l10n")
    apt = tmp_path / "apt"
    apt.mkdir()
    (apt / gimp.file).write_bytes(debs[gimp.sha1])
    (apt / "git_1.0-2_amd64.deb").write_bytes(debs[git.sha1] + b"another version")
    apt_get = (f"#!{sys.executable}\n# apt-get download PACKAGE...: what {apt} holds of them, into the current folder\n"
               "import glob, shutil, sys\nfor package in sys.argv[2:]:\n"
               f"    for deb in glob.glob(f'{apt}/{{package}}_*.deb'):\n        shutil.copy(deb, '.')\n")
    archives = pinned_archives(tmp_path / "archives", pinned, leave_out=("gimp-data", "git", "vlc-l10n"))
    with snapshot_server({git.sha1: debs[git.sha1]}) as (url, requested):
        result = run_script("prepare-l10n-de-en.sh", "--archives", archives, "--output", tmp_path / "out", "--bpe-ops", "60",
                            "--manifest", manifest, "--snapshot-url", url, download=True,
                            env={"PATH": str(path_folder(tmp_path / "bin", **{"apt-get": apt_get}))})
    assert result.returncode == 1
    assert requested == [f"/file/{git.sha1}", f"/file/{vlc.sha1}"]
    assert result.stdout.splitlines() == [
        "downloading gimp-data git vlc-l10n with apt-get download ...",
        f"apt-get download did not give the pinned {git.file}, {vlc.file}",
        f"{git.file}: fetched from {url}/file/{git.sha1}, sha256 verified",
    ]
    assert result.stderr.splitlines() == [
        f"deepnmt: error: fetching {url}/file/{vlc.sha1} failed (HTTP Error 404: Not Found); missing in {archives} "
        f"(nothing was done; put these files there, or rerun where apt-get download or {url} can be reached):",
        f"  {vlc.file}  {url}/file/{vlc.sha1}  sha256 {vlc.sha256}",
    ]
    assert (archives / gimp.file).read_bytes() == debs[gimp.sha1] and (archives / git.file).read_bytes() == debs[git.sha1]
    assert not (tmp_path / "out").exists()


def test_a_deb_with_another_hash_is_refused_and_nothing_is_built(pinned, tmp_path):
    manifest, _, debs = pinned
    (git,) = pins_of(pinned, "git")
    archives = pinned_archives(tmp_path / "archives", pinned)
    (archives / git.file).write_bytes(debs[git.sha1] + b"tampered")
    flags = ["--archives", archives, "--output", tmp_path / "out", "--bpe-ops", "60", "--manifest", manifest]
    result = run_script("prepare-l10n-de-en.sh", *flags)
    assert result.returncode == 1
    sha256 = hashlib.sha256(debs[git.sha1] + b"tampered").hexdigest()
    assert result.stderr.splitlines() == [
        f"deepnmt: error: {archives / git.file} has sha256 {sha256}, not the pinned {git.sha256}: delete it to fetch "
        "the pinned file, or build an unpinned corpus from it with --unpinned"]
    assert not (tmp_path / "out").exists()

    (archives / git.file).unlink()  # the snapshot archive's answer is verified too
    with snapshot_server({git.sha1: b"<html>Not Found</html>"}) as (url, _):
        result = run_script("prepare-l10n-de-en.sh", *flags, "--snapshot-url", url, download=True,
                            env={"PATH": str(path_folder(tmp_path / "bin"))})
    assert result.returncode == 1
    sha256 = hashlib.sha256(b"<html>Not Found</html>").hexdigest()
    assert result.stderr.splitlines() == [
        f"deepnmt: error: {url}/file/{git.sha1} is not {git.file}: sha256 {sha256}, not the pinned {git.sha256}; "
        "it was not kept"]
    assert sorted(path.name for path in archives.iterdir()) == sorted(pin.file for pin in pinned[1] if pin != git)
    assert not (tmp_path / "out").exists()


def test_missing_pinned_debs_are_listed_and_nothing_is_done(pinned, tmp_path):
    manifest = pinned[0]
    git, vlc = pins_of(pinned, "git", "vlc-l10n")
    archives = pinned_archives(tmp_path / "archives", pinned, leave_out=("git", "vlc-l10n"))
    (archives / "vlc-l10n_1.0-2_all.deb").write_bytes(b"another version: no stand-in without --unpinned")
    result = run_script("prepare-l10n-de-en.sh", "--archives", archives, "--output", tmp_path / "out", "--bpe-ops", "60",
                        "--manifest", manifest)
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        f"deepnmt: error: missing in {archives} (nothing was done; put these files there, or rerun where apt-get "
        "download or https://snapshot.debian.org can be reached):",
        f"  {git.file}  https://snapshot.debian.org/file/{git.sha1}  sha256 {git.sha256}",
        f"  {vlc.file}  https://snapshot.debian.org/file/{vlc.sha1}  sha256 {vlc.sha256}",
    ]
    assert not (tmp_path / "out").exists()


def test_a_corpus_unlike_the_pin_stops_before_data_bin_and_goes_on_with_the_flag(pinned, tmp_path):
    """Pinned .debs and settings, but text that differs from the pin (as another subword-nmt would make)."""
    record = json.loads(pinned[0].read_text())
    record["texts"]["test.en"] = "0" * 64
    record["checksum"] = l10n.checksum(record["texts"])
    manifest = tmp_path / "other.manifest.json"
    manifest.write_text(json.dumps(record))
    archives = pinned_archives(tmp_path / "archives", pinned)
    out = tmp_path / "out"
    flags = ["--archives", archives, "--output", out, "--bpe-ops", "60", "--manifest", manifest]
    result = run_script("prepare-l10n-de-en.sh", *flags)
    assert result.returncode == 1
    built = l10n.checksum(l10n.text_hashes(out))
    assert result.stderr.splitlines() == [
        f"deepnmt: error: the corpus built from the pinned .debs has checksum {built}, not the pinned "
        f"{record['checksum']} ({manifest}): the recipe or its tools (sacremoses, subword-nmt) differ from those "
        "that made the pin; build it with --unpinned, marked as unpinned"]
    assert not [name for name in ("data-bin", "README", "corpus.json") if (out / name).exists()]

    result = run_script("prepare-l10n-de-en.sh", *flags, "--unpinned")
    assert result.returncode == 0, result.stderr
    assert "[14/17] apply BPE to test.de + test.en: done before, 6 lines + 6 lines" in result.stdout.splitlines()
    assert l10n.corpus_checksum(out, manifest) == (built, False)
    assert read(out / "README")[1].startswith(f"UNPINNED CORPUS (built with --unpinned): checksum {built}")


def test_a_corrupt_package_is_named(tmp_path):
    write_packages(tmp_path / "archives")
    (tmp_path / "archives" / "git_1.0-1_amd64.deb").write_bytes(b"!<arch>\ndebian-binary   0           0     0     ")
    result = run_script("prepare-l10n-de-en.sh", "--archives", tmp_path / "archives", "--output", tmp_path / "out",
                        "--unpinned")
    assert result.returncode == 1
    assert f"{tmp_path / 'archives' / 'git_1.0-1_amd64.deb'} is corrupt or not a .deb Python can read" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
