"""Tiny archives in the exact layout of the originals, and a runner for the data-prep scripts.

Most corpus lines are written already tokenized and lowercased ("das ist satz 7 im vortrag ."), which
the Moses steps leave as they are, so a test knows each output line exactly; the few raw lines that
exercise a rule (tags, quotes, hyphens, control characters) are checked one by one.
"""

import contextlib
import gzip
import http.server
import io
import os
import shutil
import struct
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_script(name, *args, env=None, download=False):
    """Run data-prep/NAME with ARGS, never downloading unless DOWNLOAD (then give it a PATH without apt-get, or a
    fake one, and a local server: no test reaches the internet); returns the CompletedProcess."""
    command = ["bash", str(REPO / "data-prep" / name), *map(str, args), "--workers", "1"]
    command += [] if download else ["--no-download"]
    environment = dict(os.environ, PYTHON=sys.executable, PYTHONWARNINGS="ignore", no_proxy="127.0.0.1", **(env or {}))
    return subprocess.run(command, capture_output=True, text=True, env=environment, timeout=600)


def path_folder(folder, **programs):
    """A folder for $PATH holding what the data-prep scripts run (bash, dirname) and PROGRAMS ({name: script}),
    and nothing else: no apt-get unless PROGRAMS has one."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("bash", "dirname"):
        (folder / name).symlink_to(shutil.which(name))
    for name, script in programs.items():
        (folder / name).write_text(script)
        (folder / name).chmod(0o755)
    return folder


@contextlib.contextmanager
def snapshot_server(files):
    """An HTTP server on 127.0.0.1, in a thread, serving FILES ({sha1: bytes}) as /file/<sha1> the way
    snapshot.debian.org does (404 for others); yields its base URL and the list of paths requested."""
    requested = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            requested.append(self.path)
            data = files.get(self.path.removeprefix("/file/"))
            if data is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):  # pytest would show each request as captured stderr
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", requested
    finally:
        server.shutdown()
        server.server_close()


def write_tarball(path, files, compression="gz"):
    """A tarball holding FILES ({member name: text or bytes}), with the directory entries real ones have;
    gzipped unless COMPRESSION is empty (a plain .tar)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, f"w:{compression}" if compression else "w") as tar:
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
    write_test_full(folder)
    pairs = (("src", "en"), ("ref", "de"))
    test = {f"test/newstest2017-ende-{kind}.{lang}.sgm": newstest_sgm(kind, lang, 2017, 3) for kind, lang in pairs}
    write_tarball(folder / "test.tgz", test)
    return folder


def write_test_full(folder):
    """test-full.tgz: newstest2014 of each pair in both directions (4 segments each), as statmt.org ships it."""
    files = {}
    for pair, (first, second) in (("deen", ("de", "en")), ("fren", ("fr", "en"))):
        for kind, lang in (("src", "en"), ("ref", first), ("src", first), ("ref", second)):
            files[f"test-full/newstest2014-{pair}-{kind}.{lang}.sgm"] = newstest_sgm(kind, lang, 2014, 4)
    return write_tarball(folder / "test-full.tgz", files)


# --- WMT'14 En-Fr ---------------------------------------------------------------------------------

# Lines per corpus, in the recipe's order: 2800 in all, so valid is lines 1333 and 2666 (UN 133, Giga 566).
WMT_ENFR_CORPORA = (("europarl", 700), ("commoncrawl", 500), ("un", 500), ("ncv9", 400), ("giga", 700))
WMT_ENFR_RAW = {  # (corpus, line number): (en, fr), the lines that exercise a rule
    # normalize-punctuation (« » to ", the space before ! and : dropped), -a hyphens, French elision
    ("europarl", 5): ('He said: "This is state-of-the-art".', "Il a dit : « C'est l'état de l'art ! »"),
    # a \r inside a line (no line break; normalize-punctuation drops it) and U+200B (becomes a space)
    ("commoncrawl", 7): ("line\rwith\u200bcontrols", "ligne\ravec\u200bcontrôles"),
    ("un", 9): ("yes , well , that is really all .", "oui ."),  # 8 : 2 tokens, dropped by clean-corpus-n
    ("giga", 3): ("Maybe the well-known e-mail.", "Peut-être le courriel bien connu."),
}


def wmt_enfr_corpus(name, lang):
    word = {"en": "sentence", "fr": "phrase"}[lang]
    size = dict(WMT_ENFR_CORPORA)[name]
    corpus = [f"{name} {word} {number} ." for number in range(1, size + 1)]
    for (corpus_name, number), sides in WMT_ENFR_RAW.items():
        if corpus_name == name:
            corpus[number - 1] = sides[("en", "fr").index(lang)]
    return lines(*corpus)


def write_wmt_enfr_archives(folder):
    """prepare-wmt14en2fr.sh's six archives in their original layout, other language pairs included:
    Giga-FrEn is a plain tar of the two gzipped sides at its top level."""
    languages = ("en", "fr")
    europarl = {f"training/europarl-v7.fr-en.{lang}": wmt_enfr_corpus("europarl", lang) for lang in languages}
    europarl["training/europarl-v7.de-en.de"] = "x\n"
    write_tarball(folder / "training-parallel-europarl-v7.tgz", europarl)
    commoncrawl = {f"commoncrawl.fr-en.{lang}": wmt_enfr_corpus("commoncrawl", lang) for lang in languages}
    commoncrawl["commoncrawl.fr-en.annotation"] = "x\n"
    commoncrawl["commoncrawl.de-en.de"] = "x\n"
    write_tarball(folder / "training-parallel-commoncrawl.tgz", commoncrawl)
    un = {f"un/undoc.2000.fr-en.{lang}": wmt_enfr_corpus("un", lang) for lang in languages}
    un["un/undoc.2000.es-en.es"] = "x\n"
    write_tarball(folder / "training-parallel-un.tgz", un)
    news = {f"training/news-commentary-v9.fr-en.{lang}": wmt_enfr_corpus("ncv9", lang) for lang in languages}
    news["training/news-commentary-v9.de-en.de"] = "x\n"
    write_tarball(folder / "training-parallel-nc-v9.tgz", news)
    giga = {
        f"giga-fren.release2.fixed.{lang}.gz": gzip.compress(wmt_enfr_corpus("giga", lang).encode("utf-8"))
        for lang in languages
    }
    write_tarball(folder / "training-giga-fren.tar", giga, compression="")
    write_test_full(folder)
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


def write_deb(folder, package, version, files, architecture="all"):
    """A <package>_<version>_<architecture>.deb as dpkg-deb builds it: an ar archive of debian-binary,
    control.tar.xz and data.tar.xz holding FILES ({path: bytes}) under ./ with their directory entries."""
    control = io.BytesIO()
    with tarfile.open(fileobj=control, mode="w:xz") as tar:
        data = f"Package: {package}\nVersion: {version}\nArchitecture: {architecture}\n".encode()
        entry = tarfile.TarInfo("./control")
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    payload = io.BytesIO()
    with tarfile.open(fileobj=payload, mode="w:xz") as tar:
        directories = {"./"} | {f"./{parent}/" for path in files for parent in map(str, Path(path).parents) if parent != "."}
        for directory in sorted(directories):
            entry = tarfile.TarInfo(directory)
            entry.type = tarfile.DIRTYPE
            tar.addfile(entry)
        for path, data in files.items():
            entry = tarfile.TarInfo(f"./{path}")
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
    path = folder / f"{package}_{version}_{architecture}.deb"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(archive)
    return path


def write_ding_deb(folder):
    return write_deb(folder, "trans-de-en", "1.9-6", {"usr/share/trans/de-en": ding_dictionary().encode("utf-8")})


def mo_catalog(messages):
    """A compiled gettext catalog (GNU .mo, as msgfmt writes it) of MESSAGES ({msgid: msgstr}); a msgid
    "ctx\x04id" has a context, "one\x00many" a plural whose msgstr is "form0\x00form1"."""
    entries = sorted({"": "Content-Type: text/plain; charset=UTF-8\n", **messages}.items())
    ids, strs = ([text.encode("utf-8") for text in column] for column in zip(*entries))
    count, table = len(entries), 28
    offset = table + 16 * count  # two tables of (length, offset) pairs, then the strings
    header = struct.pack("<7I", 0x950412DE, 0, count, table, table + 8 * count, 0, offset)
    tables, blob = [b"", b""], b""
    for column, strings in enumerate((ids, strs)):
        for data in strings:
            tables[column] += struct.pack("<2I", len(data), offset + len(blob))
            blob += data + b"\0"
    return header + tables[0] + tables[1] + blob


def read(path):
    return Path(path).read_text(encoding="utf-8").split("\n")[:-1]


def unbpe(line):
    return line.replace("@@ ", "")


# --- running a recipe and checking its BPE'd and binarized output ---------------------------------

BPE_OPS = "30"


def built(tmp_path_factory, name, script, archives_writer, env=None):
    """Write the archives of a recipe into a fresh folder and run its script there with --bpe-ops 30."""
    root = tmp_path_factory.mktemp(name)
    archives_writer(root / "archives")
    paths = ["--archives", root / "archives", "--output", root / "out"]
    result = run_script(script, *paths, "--bpe-ops", BPE_OPS, env=env)
    assert result.returncode == 0, result.stderr
    return root, result


def built_with_sacrebleu_cache(tmp_path_factory, name, script, archives_writer):
    """``built`` with a sacreBLEU cache folder of its own (``$SACREBLEU``), returned third."""
    cache = tmp_path_factory.mktemp(f"sacrebleu-{name}")
    root, result = built(tmp_path_factory, name, script, archives_writer, env={"SACREBLEU": str(cache)})
    return root, result, cache


def sacrebleu_echo(cache, test_set, langpair, field):
    """The lines of ``sacrebleu -t TEST_SET -l LANGPAIR --echo FIELD`` run offline: from CACHE, nothing on PATH."""
    echo = subprocess.run(
        [sys.executable, "-m", "sacrebleu", "-t", test_set, "-l", langpair, "--echo", field],
        capture_output=True,
        text=True,
        env={"SACREBLEU": str(cache), "PATH": ""},
        timeout=120,
    )
    assert echo.returncode == 0, echo.stderr
    return echo.stdout.splitlines()


def binarized(data_bin, split, pair, lang):
    """The sentences of data-bin/SPLIT.PAIR.LANG, as fairseq reads them back (with <unk> for subwords
    the training data lacks)."""
    from fairseq.data import Dictionary, data_utils

    dictionary = Dictionary.load(str(data_bin / f"dict.{lang}.txt"))
    dataset = data_utils.load_indexed_dataset(str(data_bin / f"{split}.{pair}.{lang}"), dictionary)
    return [dictionary.string(dataset[index]) for index in range(len(dataset))]


def check_bpe_and_binarized(out, counts, languages, pre_bpe):
    """The BPE'd text undoes to PRE_BPE[split, lang] and data-bin holds exactly it, joined dictionary."""
    merges = read(out / "code")
    assert merges[0] == "#version: 0.2" and len(merges) == 1 + int(BPE_OPS)
    assert any("@@ " in line for line in read(out / f"train.{languages[0]}"))
    dictionaries = [read(out / "data-bin" / f"dict.{lang}.txt") for lang in languages]
    assert dictionaries[0] == dictionaries[1]
    for split, count in counts.items():
        for lang in languages:
            text = read(out / f"{split}.{lang}")
            assert len(text) == count
            assert [unbpe(line) for line in text] == pre_bpe[split, lang]
            vocabulary = {entry.split()[0] for entry in dictionaries[0]}
            known = [" ".join(token if token in vocabulary else "<unk>" for token in line.split()) for line in text]
            assert binarized(out / "data-bin", split, "-".join(languages), lang) == known
            if split == "train":
                assert known == text
