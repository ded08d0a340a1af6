"""data-prep/prepare-l10n-de-en.sh: the depth study's corpus from Debian packages' German gettext catalogs,
built offline from fixture .debs in the exact layout (ar of debian-binary, control.tar.xz, data.tar.xz)."""

import zlib

import pytest
from data_fixtures import binarized, mo_catalog, read, run_script, write_deb

from deepnmt_plugin.data import l10n

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
                        "--bpe-ops", "60")
    assert result.returncode == 0, result.stderr
    return root / "out", result


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
    extract = result.stdout.splitlines()[1]
    assert extract.startswith("[1/16] extract the German catalogs of 14 packages ... 222 messages of audacity-data_1.0-1_all.deb")
    line = read(tmp / "train.raw.de").index("Speichern unter …")
    assert read(tmp / "train.tok.de")[line] == "speichern unter ..."  # Moses normalization and lowercasing, as IWSLT
    assert binarized(out / "data-bin", "train", "de-en", "en") == read(out / "train.en")
    readme = (out / "README").read_text()
    assert "libreoffice-l10n-de MPL-2.0" in readme and "principal one of each package" in readme and "CRC-32 of the German text modulo 50" in readme


def test_missing_packages_are_listed_and_nothing_is_done(tmp_path):
    write_packages(tmp_path / "archives")
    (tmp_path / "archives" / "git_1.0-1_amd64.deb").unlink()
    (tmp_path / "archives" / "vlc-l10n_1.0-1_all.deb").unlink()
    result = run_script("prepare-l10n-de-en.sh", "--archives", tmp_path / "archives", "--output", tmp_path / "out")
    assert result.returncode == 1
    assert "`apt-get download git vlc-l10n`" in result.stderr
    assert "  git_<version>_<arch>.deb  (https://packages.debian.org/git)" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_corrupt_package_is_named(tmp_path):
    write_packages(tmp_path / "archives")
    (tmp_path / "archives" / "git_1.0-1_amd64.deb").write_bytes(b"!<arch>\ndebian-binary   0           0     0     ")
    result = run_script("prepare-l10n-de-en.sh", "--archives", tmp_path / "archives", "--output", tmp_path / "out")
    assert result.returncode == 1
    assert f"{tmp_path / 'archives' / 'git_1.0-1_amd64.deb'} is corrupt or not a .deb Python can read" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
