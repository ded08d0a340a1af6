"""Depth-study corpus: German-English user-interface strings from the gettext catalogs of Debian packages.

Every package below ships ``<prefix>/de/LC_MESSAGES/<domain>.mo``: compiled gettext catalogs mapping an
English message (msgid) to its German translation (msgstr), the material of OPUS's GNOME/KDE/Ubuntu
corpora. Short, repetitive, real text: a small model learns it in minutes of CPU, where dictionary
example sentences teach it little. ``L10N.about`` states the rules.
"""

import functools
import gettext
import io
import re
import zlib
from pathlib import Path
from typing import Dict, Iterable, List, Tuple

from deepnmt_plugin.data import debian, recipes
from deepnmt_plugin.data.ding import preprocess
from deepnmt_plugin.data.pipeline import DataPrepError, Step, write_lines
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


def ensure_packages(options: Options) -> None:
    debian.download_missing(list(PACKAGES), options.archives, options.download, "")


def l10n_steps(options: Options) -> List[Step]:
    tmp, languages = options.tmp, ("de", "en")

    def extract(*paths):
        debs = [debian.newest_deb(options.archives, package) for package in PACKAGES]
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
    return steps


L10N = Recipe(
    name="l10n-de-en",
    title="Debian German-English software-localisation corpus (depth study)",
    source_lang="de",
    target_lang="en",
    default_output="l10n.tokenized.de-en",
    default_bpe_ops=2000,
    ensure_sources=ensure_packages,
    corpus_steps=l10n_steps,
    about=f"""
Source: the German gettext catalogs (*/de/LC_MESSAGES/*.mo) of {len(PACKAGES)} Debian 12 packages,
`apt-get download {' '.join(PACKAGES)}`.
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
