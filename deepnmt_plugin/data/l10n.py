"""Depth-study corpus: German-English user-interface strings from the gettext catalogs of Debian packages.

Every package below ships ``<prefix>/de/LC_MESSAGES/<domain>.mo``: compiled gettext catalogs mapping an
English message (msgid) to its German translation (msgstr), the material of OPUS's GNOME/KDE/Ubuntu
corpora. Short, repetitive, real text: a small model learns it in minutes of CPU, where dictionary
example sentences teach it little. ``L10N.about`` states the rules.

The study's corpus is pinned by ``MANIFEST``: every .deb by its hashes, and the BPE'd text by its sha256
(``corpus_checksum``), so that the same command builds the same corpus wherever and whenever it runs.
"""

import dataclasses
import functools
import gettext
import hashlib
import io
import json
import re
import zlib
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

from deepnmt_plugin.data import debian, recipes
from deepnmt_plugin.data.ding import preprocess
from deepnmt_plugin.data.pipeline import DataPrepError, Step, source_fingerprints, write_lines, write_text_atomically
from deepnmt_plugin.data.recipes import SPLITS, Options, Recipe

# Debian 12 (bookworm) packages with large German catalogs, and the principal licence of each (its
# usr/share/doc/<package>/copyright has the full terms).
PACKAGES = {
    "audacity-data": "GPL-2+",
    "evolution-common": "LGPL-2+",
    "filezilla-common": "GPL-2+",
    "gimp-data": "GPL-3+",
    "git": "GPL-2",
    "gnome-control-center-data": "GPL-2+",
    "gnucash-common": "GPL-2+",
    "inkscape": "GPL-2+",
    "libglib2.0-data": "LGPL-2.1+",
    "libgtk-3-common": "LGPL-2+",
    "libreoffice-l10n-de": "MPL-2.0",
    "nautilus-data": "GPL-3+",
    "plasma-desktop-data": "GPL-2+",
    "vlc-l10n": "GPL-2+",
}
CATALOG = re.compile(r"(^|/)de/LC_MESSAGES/[^/]+\.mo$")
HELD_OUT_EVERY = 50  # by a hash of the German text: residue 0 to test, 1 to valid, the rest to train
# Pairs longer than this, or one side more than CLEAN_RATIO times the other, are dropped by clean-corpus-n.
CLEAN_RATIO = 3
MAX_TOKENS = 50
LETTER = re.compile(r"[^\W\d_]")
# A mnemonic marks the access key of a menu item: _File (GTK), &File (Qt/KDE), ~File (LibreOffice).
MNEMONIC = re.compile(r"[_&~](?=\w)")
ENTITY = re.compile(r"&\w+;")


def ui_text(message: str) -> str:
    """A catalog message as the user reads it: the gettext context (``ctx\\x04``) dropped, the mnemonic
    marker removed when there is exactly one (so ``client_name`` or ``a && b`` stay), whitespace collapsed."""
    text = message.rsplit("\x04", 1)[-1]
    for marker in "_&~":
        if text.count(marker) == 1 and not ENTITY.search(text):
            text = MNEMONIC.sub(lambda match: "" if match.group() == marker else match.group(), text)
    return " ".join(text.split())


def catalog_pairs(mo_file: bytes) -> Iterable[Tuple[str, str]]:
    """(German, English) of every translated message; plural forms give their singular."""
    catalog = gettext.GNUTranslations(io.BytesIO(mo_file))._catalog
    for key, german in catalog.items():
        english, form = key if isinstance(key, tuple) else (key, 0)  # plurals are keyed (msgid, form)
        if english and form == 0:  # the empty msgid holds the catalog's header
            yield ui_text(german), ui_text(english)


def package_pairs(deb: Path) -> List[Tuple[str, str]]:
    pairs = []
    for path, content in debian.deb_data_files(deb, CATALOG.search):
        try:
            pairs += catalog_pairs(content)
        except (OSError, UnicodeDecodeError) as error:
            raise DataPrepError(f"{deb}: {path} is not a gettext catalog Python can read ({error})") from error
    return pairs


def held_out_split(german: str) -> str:
    """The split of a German text, from its CRC-32: stable whatever the package set or order."""
    residue = zlib.crc32(german.encode("utf-8")) % HELD_OUT_EVERY
    return {0: "test", 1: "valid"}.get(residue, "train")


def split_pairs(packages: Iterable[Iterable[Tuple[str, str]]]) -> Tuple[Dict[str, list], int]:
    """{"train": [(de, en), ...], ...} and the number of catalog messages read. A pair is kept once per
    German text (the first package's translation wins), and only when both sides hold a letter and differ
    (an untranslated message or a bare name teaches copying, not translation)."""
    splits, seen, messages = {split: [] for split in SPLITS}, set(), 0
    for pairs in packages:
        for german, english in pairs:
            messages += 1
            if german in seen or german.casefold() == english.casefold():
                continue
            if not (LETTER.search(german) and LETTER.search(english)):
                continue
            seen.add(german)
            splits[held_out_split(german)].append((german, english))
    return splits, messages


# --- the pinned corpus ------------------------------------------------------------------------------

MANIFEST = Path(__file__).resolve().parents[2] / "data-prep" / "l10n-de-en.manifest.json"
TEXTS = tuple(f"{split}.{lang}" for split in SPLITS for lang in ("de", "en"))  # the checksum's order
STAMP = "corpus.json"  # in --output: what the corpus was built from, its checksum and whether it is the pinned one
ABOUT_MANIFEST = ("The depth study's l10n-de-en corpus (data-prep/prepare-l10n-de-en.sh, data-prep/README.md): the "
                  ".debs it is built from and the sha256 of its BPE'd text; checksum: the sha256 of the output of "
                  f"`sha256sum {' '.join(TEXTS)}`.")


def text_hashes(folder: Path) -> Dict[str, str]:
    missing = [name for name in TEXTS if not (folder / name).is_file()]
    if missing:
        raise DataPrepError(f"{folder} lacks {', '.join(missing)}: not a built l10n-de-en corpus")
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in TEXTS}


def checksum(hashes: Dict[str, str]) -> str:
    """One hash for the six files, reproducible in a shell as ``sha256sum <TEXTS> | sha256sum``."""
    return hashlib.sha256("".join(f"{hashes[name]}  {name}\n" for name in TEXTS).encode()).hexdigest()


def corpus_checksum(output: Path, manifest: Path = MANIFEST) -> Tuple[str, bool]:
    """(checksum of the corpus in ``output``, whether it is the pinned one). Computed from the text files, not
    read from their stamp, so a corpus built before stamps existed, or changed since, is reported as it is."""
    found = checksum(text_hashes(Path(output)))
    return found, found == read_manifest(manifest)["checksum"]


def read_manifest(path: Path) -> dict:
    """The manifest at ``path``, its .debs also as ``pins``."""
    try:
        manifest = json.loads(Path(path).read_text(encoding="utf-8"))
        manifest["pins"] = [debian.PinnedDeb(**deb) for deb in manifest["debs"]]
        consistent = checksum(manifest["texts"]) == manifest["checksum"] and "bpe_ops" in manifest["settings"]
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise DataPrepError(f"{path} is not an l10n-de-en manifest ({type(error).__name__}: {error})") from error
    if [pin.package for pin in manifest["pins"]] != list(PACKAGES) or not consistent:
        raise DataPrepError(f"{path} is not an l10n-de-en manifest: it must pin the {len(PACKAGES)} packages "
                            "in the recipe's order, and its checksum must be that of its texts")
    return manifest


def manifest_path(options: Options) -> Path:
    return options.manifest or MANIFEST


def manifest_settings(options: Options) -> dict:
    """The flags that shape the text files (not --joined-dictionary, which shapes data-bin only)."""
    return {"bpe": options.bpe, "bpe_ops": options.bpe_ops}


def ensure_packages(options: Options) -> None:
    manifest = read_manifest(manifest_path(options))
    if manifest_settings(options) != manifest["settings"] and not options.unpinned:
        pinned = manifest["settings"]
        raise DataPrepError(f"--bpe {options.bpe} --bpe-ops {options.bpe_ops} build another corpus than the pinned "
                            f"one (--bpe {pinned['bpe']} --bpe-ops {pinned['bpe_ops']}, {manifest_path(options)}): "
                            "build it with --unpinned, marked as unpinned")
    debian.ensure_pinned(manifest["pins"], options.archives, options.download, options.snapshot_url, options.unpinned)


def package_debs(options: Options) -> List[Path]:
    """The .deb of each package, in the recipe's order, once ``ensure_packages`` has run."""
    return debian.pinned_debs(read_manifest(manifest_path(options))["pins"], options.archives, options.unpinned)


def corpus_record(debs: Iterable[Path], folder: Path, settings: dict) -> dict:
    """A corpus as a manifest pins it: its .debs, the settings that shape it, its texts' hashes and checksum."""
    hashes = text_hashes(folder)
    return {"settings": settings, "debs": [dataclasses.asdict(debian.pin_of(deb)) for deb in debs],
            "texts": hashes, "checksum": checksum(hashes)}


def check_step(options: Options) -> Step:
    """Stamp the BPE'd text with its checksum; one that is not the pinned one goes on only with --unpinned."""
    manifest = manifest_path(options)

    def check(stamp: Path) -> str:
        pinned = read_manifest(manifest)["checksum"]
        record = corpus_record(package_debs(options), options.output, manifest_settings(options))
        if record["checksum"] != pinned and not options.unpinned:
            raise DataPrepError(f"the corpus built from the pinned .debs has checksum {record['checksum']}, not the "
                                f"pinned {pinned} ({manifest}): the recipe or its tools (sacremoses, subword-nmt) "
                                "differ from those that made the pin; build it with --unpinned, marked as unpinned")
        record.update(pinned=record["checksum"] == pinned, pinned_checksum=pinned, manifest=str(manifest))
        write_text_atomically(stamp, json.dumps(record, indent=1) + "\n")
        return f"checksum {record['checksum']}, {'the pinned one' if record['pinned'] else 'NOT the pinned one'}"

    # The flag is an input: a corpus built with it is checked again when it is dropped.
    inputs = {"sources": source_fingerprints(package_debs(options)),
              "settings": dict(L10N.settings(options), unpinned=options.unpinned)}
    return Step("check the corpus against the pinned checksum", [options.output / STAMP], check, inputs)


def readme_notice(options: Options) -> str:
    record = json.loads((options.output / STAMP).read_text(encoding="utf-8"))
    if record["pinned"]:
        return f"Corpus checksum {record['checksum']}: the pinned one ({record['manifest']})."
    return (f"UNPINNED CORPUS (built with --unpinned): checksum {record['checksum']}, not the pinned "
            f"{record['pinned_checksum']} of {record['manifest']}; {STAMP} lists the .debs it was built from.")


def pin(output: Path, manifest: Path = MANIFEST) -> None:
    """Re-pin: make the corpus built in ``output`` (with --unpinned, from the .debs to pin) the pinned one."""
    record = json.loads((Path(output) / STAMP).read_text(encoding="utf-8"))
    pinned = {"about": ABOUT_MANIFEST, **{key: record[key] for key in ("settings", "debs", "texts", "checksum")}}
    write_text_atomically(Path(manifest), json.dumps(pinned, indent=1) + "\n")


# --- the recipe -------------------------------------------------------------------------------------


def l10n_steps(options: Options) -> List[Step]:
    tmp, languages = options.tmp, ("de", "en")

    def extract(*paths):
        debs = package_debs(options)
        splits, messages = split_pairs(package_pairs(deb) for deb in debs)
        for split, (german_path, english_path) in zip(SPLITS, zip(paths[0::2], paths[1::2])):
            write_lines(german_path, (german for german, _ in splits[split]))
            write_lines(english_path, (english for _, english in splits[split]))
        counts = ", ".join(f"{split} {len(splits[split])}" for split in SPLITS)
        return f"{messages} messages of {', '.join(deb.name for deb in debs)}: {counts}"

    steps = [Step(f"extract the German catalogs of {len(PACKAGES)} packages",
                  [tmp / f"{split}.raw.{lang}" for split in SPLITS for lang in languages], extract)]
    for split in SPLITS:
        for lang in languages:
            steps.append(recipes.map_step(
                f"normalize + tokenize + lowercase {split}.{lang}",
                functools.partial(recipes.read_lines, tmp / f"{split}.raw.{lang}"),
                functools.partial(preprocess, lang=lang),
                tmp / f"{split}.tok.{lang}",
                options.workers,
            ))
        steps.append(recipes.clean_step(
            f"clean-corpus-n {split}.tok", [tmp / f"{split}.tok.{lang}" for lang in languages],
            [tmp / f"{split}.{lang}" for lang in languages], CLEAN_RATIO, 1, MAX_TOKENS,
        ))
    steps.append(recipes.learn_bpe_step(options, [tmp / f"train.{lang}" for lang in languages]))
    for split in SPLITS:
        steps.append(recipes.apply_bpe_step(
            options, [tmp / f"{split}.{lang}" for lang in languages],
            [options.output / f"{split}.{lang}" for lang in languages],
        ))
    steps.append(check_step(options))
    return steps


L10N = Recipe(
    name="l10n-de-en",
    title="Debian German-English software-localisation corpus (depth study)",
    source_lang="de",
    target_lang="en",
    default_output="l10n.tokenized.de-en",
    default_bpe_ops=2000,
    ensure_sources=ensure_packages,
    sources=package_debs,
    corpus_steps=l10n_steps,
    readme_notice=readme_notice,
    about=f"""
Source: the German gettext catalogs (*/de/LC_MESSAGES/*.mo) of {len(PACKAGES)} Debian 12 packages,
`apt-get download {' '.join(PACKAGES)}`,
the versions pinned by data-prep/l10n-de-en.manifest.json (fetched from snapshot.debian.org where apt-get
gives others); {STAMP} lists the .debs used.
Licences (the principal one of each package; its usr/share/doc/<package>/copyright has the full terms):
{', '.join(f'{package} {licence}' for package, licence in PACKAGES.items())}. This corpus is derived
from them, so those licences apply to it.
Pairs: German msgstr -> English msgid of every translated message (plurals: the singular), the gettext
context dropped, a single mnemonic marker (_ & ~) removed, whitespace collapsed; kept once per German
text (packages in the order above), and only when both sides hold a letter and differ.
Split: by CRC-32 of the German text modulo {HELD_OUT_EVERY}: 0 to test, 1 to valid, the rest to train. The
same message in several packages is therefore never on both sides of the split, though near-variants
("Open File" / "Open File...") can be.
Pre-processing: normalize-punctuation, remove-non-printing-char, Moses tokenizer (no -a, as IWSLT),
lowercase; clean-corpus-n -ratio {CLEAN_RATIO}, 1-{MAX_TOKENS} tokens, on every split; joint BPE on train.
""",
)
