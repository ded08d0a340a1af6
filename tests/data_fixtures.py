"""Tiny archives in the exact layout of the originals, and a runner for the data-prep scripts.

Most corpus lines are written already tokenized and lowercased ("das ist satz 7 im vortrag ."), which
the Moses steps leave as they are, so a test knows each output line exactly; the few raw lines that
exercise a rule (tags, quotes, hyphens, control characters) are checked one by one.
"""

import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_script(name, *args, env=None):
    """Run data-prep/NAME with ARGS, never downloading; returns the CompletedProcess."""
    command = ["bash", str(REPO / "data-prep" / name), *map(str, args), "--workers", "1", "--no-download"]
    environment = dict(os.environ, PYTHON=sys.executable, PYTHONWARNINGS="ignore", **(env or {}))
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)


def write_tarball(path, files):
    """A tarball holding FILES ({member name: text}), with the directory entries real ones have."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        directories = sorted({str(Path(name).parent) for name in files} - {"."})
        for directory in directories:
            entry = tarfile.TarInfo(directory)
            entry.type, entry.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(entry)
        for name, text in files.items():
            data = text.encode("utf-8") if isinstance(text, str) else text
            entry = tarfile.TarInfo(name)
            entry.size, entry.mode = len(data), 0o644
            tar.addfile(entry, io.BytesIO(data))
    return path


def lines(*items):
    return "".join(item + "\n" for item in items)


# --- IWSLT'14 de-en.tgz ---------------------------------------------------------------------------

IWSLT_TEST_SEGMENTS = {  # test set -> number of <seg> lines
    "IWSLT14.TED.dev2010": 3,
    "IWSLT14.TEDX.dev2012": 2,
    "IWSLT14.TED.tst2010": 2,
    "IWSLT14.TED.tst2011": 2,
    "IWSLT14.TED.tst2012": 1,
}


def iwslt_talk_header(lang, talk):
    title, description = {"de": ("Ein Vortrag", "Über Dinge."), "en": ("A talk", "About things.")}[lang]
    return [
        f"<url>http://www.ted.com/talks/lang/{lang}/talk_{talk}.html</url>",
        "<keywords>talks, science</keywords>",
        "<speaker>Jane Doe</speaker>",
        f"<talkid>{talk}</talkid>",
        f"<title>Jane Doe: {title} {talk}</title>",
        f"<description>TED Talk Subtitles and Transcript: {description}</description>",
    ]


def iwslt_content(lang, talk):
    """25 lines per talk: 23 in tokenized lowercase form, then one pair clean-corpus-n drops
    (talk 1: ratio 1 : 7 > 1.5; talk 2: an empty German side) and one raw line to tokenize."""
    sentence = {"de": "das ist satz {} im vortrag {} .", "en": "this is sentence {} of talk {} ."}[lang]
    content = [sentence.format(number, talk) for number in range(1, 24)]
    if talk == 1:
        content.append({"de": "ja .", "en": "yes , well , that is all ."}[lang])
        content.append({"de": "Vielen Dank, Chris.", "en": "Thank you so much, Chris."}[lang])
    else:
        content.append({"de": "", "en": "something ."}[lang])
        content.append({"de": "Es ist „wahr“ – sagt’s.", "en": "It's true - isn't it?"}[lang])
    return content


def iwslt_xml(lang, test_set, segments):
    srcset = "srcset" if lang == "de" else "refset"
    segs = [
        f'<seg id="{number}"> {test_set.split(".")[-1]} {lang} seg {number} ’s Text. </seg>'
        for number in range(1, segments + 1)
    ]
    return lines(
        '<?xml version="1.0" encoding="UTF-8"?>',
        "<mteval>",
        f'<{srcset} setid="iwslt2014" srclang="german">',
        '<doc docid="535" genre="lectures">',
        "<url>http://www.ted.com/talks/talk.html</url>",
        "<keywords>talks</keywords>",
        "<talkid>535</talkid>",
        "<title>Jane Doe: A talk</title>",
        *segs,
        "</doc>",
        f"</{srcset}>",
        "</mteval>",
    )


def write_iwslt_archive(folder):
    files = {}
    for lang in ("de", "en"):
        train = [
            line for talk in (1, 2) for line in iwslt_talk_header(lang, talk) + iwslt_content(lang, talk)
        ]
        files[f"de-en/train.tags.de-en.{lang}"] = lines(*train)
        for test_set, segments in IWSLT_TEST_SEGMENTS.items():
            files[f"de-en/{test_set}.de-en.{lang}.xml"] = iwslt_xml(lang, test_set, segments)
    files["de-en/README"] = "IWSLT 2014 evaluation campaign: German-English TED talks.\n"
    return write_tarball(folder / "de-en.tgz", files)


# --- WMT'14 / WMT'17 En-De ------------------------------------------------------------------------

def wmt_corpus(name, lang, size):
    """SIZE tokenized lines, plus raw ones: line 5 of Europarl (quotes, hyphen), line 7 of Common Crawl
    (a carriage return and a zero-width space inside), line 9 of Common Crawl (dropped: ratio 1 : 8)."""
    word = {"de": "satz", "en": "sentence"}[lang]
    corpus = [f"{name} {word} {number} ." for number in range(1, size + 1)]
    if name == "europarl":
        corpus[4] = {"de": "Er sagte: „Das ist state-of-the-art.“", "en": 'He said: "This is state-of-the-art".'}[lang]
    if name == "commoncrawl":
        corpus[6] = {"de": "Zeile\rmit\u200bSteuerzeichen", "en": "line\rwith\u200bcontrols"}[lang]
        corpus[8] = {"de": "ja .", "en": "yes , well , that is really all ."}[lang]
    return lines(*corpus)


def newstest_sgm(kind, lang, year, segments):
    setid, element = f"newstest{year}", {"src": "srcset", "ref": "refset"}[kind]
    languages = 'srclang="any"' if kind == "src" else f'srclang="any" trglang="{lang}"'
    segs = [f'<seg id="{number}">{setid} {kind} {lang} ’s seg {number}</seg>' for number in range(1, segments + 1)]
    doc = '<doc sysid="ref" docid="1012-bbc" genre="news" origlang="en">'
    return lines(f'<{element} setid="{setid}" {languages}>', doc, "<p>", *segs, "</p>", "</doc>", f"</{element}>")


def write_wmt_archives(folder, news_commentary_versions=("v12",)):
    """The archives as statmt.org ships them (Europarl also holds other pairs, Common Crawl other files);
    Europarl 120 + Common Crawl 70 + News Commentary 60 lines: valid is lines 100 and 200."""
    languages = ("de", "en")
    europarl = {f"training/europarl-v7.de-en.{lang}": wmt_corpus("europarl", lang, 120) for lang in languages}
    europarl["training/europarl-v7.fr-en.fr"] = "x\n"
    write_tarball(folder / "training-parallel-europarl-v7.tgz", europarl)
    commoncrawl = {f"commoncrawl.de-en.{lang}": wmt_corpus("commoncrawl", lang, 70) for lang in languages}
    commoncrawl["commoncrawl.de-en.annotation"] = "x\n"
    write_tarball(folder / "training-parallel-commoncrawl.tgz", commoncrawl)
    for version in news_commentary_versions:
        name = f"training/news-commentary-{version}.de-en"
        news = {f"{name}.{lang}": wmt_corpus(f"nc{version}", lang, 60) for lang in languages}
        write_tarball(folder / f"training-parallel-nc-{version}.tgz", news)
    pairs = (("src", "en"), ("ref", "de"), ("src", "de"), ("ref", "en"))
    test_full = {f"test-full/newstest2014-deen-{kind}.{lang}.sgm": newstest_sgm(kind, lang, 2014, 4) for kind, lang in pairs}
    write_tarball(folder / "test-full.tgz", test_full)
    test = {f"test/newstest2017-ende-{kind}.{lang}.sgm": newstest_sgm(kind, lang, 2017, 3) for kind, lang in pairs[:2]}
    write_tarball(folder / "test.tgz", test)
    return folder


# --- Ding (trans-de-en) ---------------------------------------------------------------------------

DING_HEADER = [
    "# Version :: devel 2023-01-30",
    "# Copyright (c) :: Frank Richter <frank.richter.tu-chemnitz.de>,",
    "# 1995 - 2023",
    "# License :: GPL Version 2 or later; GNU General Public License",
]
DING_ENTRIES = [
    # sentence 1 (its first alternative) and a phrase
    "Abend {m} | Noch ist nicht aller Tage Abend.; Man soll den Tag nicht vor dem Abend loben. :: evening | It’s not over until it’s over.; It ain’t over till the fat lady sings. [Am.]",
    # phrases with annotations; sentence 2
    "Abendessen {n}; Abendbrot {n}; Nachtmahl {n} [Ös.] | Das Abendessen hat mir geschmeckt. :: supper; evening meal | I enjoyed my supper.",
    "Ablöse {f} /Abl./; Abstandszahlung {f} (Mietobjekt) <Ablösebetrag> :: key money [Br.]; premium (on a lease)",
    "Aal {m} (auf der Speisekarte (bes. in Restaurants)) [cook.] | Aal blau; blauer Aal :: eel (on a menu) | eel au bleu",
    # parts do not align: skipped
    "Aalfang {m} | Aalfänge {pl} :: eel fishing",
    # one German word for nine English ones: clean-corpus-n -ratio 3 drops it
    "Aalsuppe {f} :: a soup made from eels in the northern style",
    # the same sentence again, other English: one pair per German sentence
    "Geschmack {m} | Das Abendessen hat mir geschmeckt. :: taste | I liked the dinner.",
    # English side not a sentence: a phrase
    "Einspruch! :: objection!",
]


def ding_generated_entry(number):
    """Sentence number NUMBER (3 to 41: after the two above) and a phrase."""
    return f"Satz {{m}} | Ich lese heute Satz {number}. :: sentence | Today I read sentence {number}."


def ding_dictionary():
    entries = DING_ENTRIES + [ding_generated_entry(number) for number in range(3, 42)]
    # a phrase whose German is the held-out test sentence 20: kept out of train
    entries.append("Satzlesen {n} | Ich lese heute Satz 20. :: reading | i read sentence 20 today")
    return lines(*DING_HEADER, *entries)


def write_ding_deb(folder):
    """A trans-de-en_1.9-6_all.deb as dpkg-deb builds it: an ar archive of debian-binary,
    control.tar.xz and data.tar.xz."""
    control = io.BytesIO()
    with tarfile.open(fileobj=control, mode="w:xz") as tar:
        data = b"Package: trans-de-en\nVersion: 1.9-6\nArchitecture: all\n"
        entry = tarfile.TarInfo("./control")
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:xz") as tar:
        for directory in ("./", "./usr/", "./usr/share/", "./usr/share/trans/"):
            entry = tarfile.TarInfo(directory)
            entry.type = tarfile.DIRTYPE
            tar.addfile(entry)
        data = ding_dictionary().encode("utf-8")
        entry = tarfile.TarInfo("./usr/share/trans/de-en")
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    members = [
        ("debian-binary", b"2.0\n"),
        ("control.tar.xz", control.getvalue()),
        ("data.tar.xz", payload.getvalue()),
    ]
    archive = b"!<arch>\n"
    for name, data in members:
        header = f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode()
        archive += header + data + (b"\n" if len(data) % 2 else b"")
    path = folder / "trans-de-en_1.9-6_all.deb"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(archive)
    return path


def read(path):
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def unbpe(line):
    return line.replace("@@ ", "")
