"""Serving with CTranslate2: the converted model writes fairseq-generate's hypotheses, an exported checkpoint converts
and stays weights-only, T-Fixup is refused in one line, and translate.py goes from raw German to detokenized English
exactly as the data-prep, fairseq-generate and the Moses detokenizer do."""

import io
import json
import re
import sys

import ctranslate2
import pytest
import torch
from fairseq import options, tasks
from fairseq.data.data_utils import post_process
from fairseq_cli import preprocess
from sacremoses import MosesDetokenizer

from conftest import FORK_SERVER, TINY_DIMS, USER_DIR, fairseq_cli
from corpus import write_corpus
from deepnmt_plugin.data import ding, l10n, recipes, subwords
from deepnmt_plugin.data.__main__ import RECIPES
from deepnmt_plugin.data.pipeline import read_lines, stamp_output, write_lines
from deepnmt_plugin.export import ExportError, export_checkpoint, export_ctranslate2
from deepnmt_plugin.export import main as export_main
from deepnmt_plugin.serving import RECIPE_TEXT_STEPS, TextProcessing, translate_batches
from deepnmt_plugin.translate import RawTextTranslator
from deepnmt_plugin.translate import main as translate_main
from tiny_training import checkpoint_of, hypotheses
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

SERVABLE = ["transformer_preln_iwslt_de_en", "transformer_deepnorm_iwslt_de_en", "transformer_admin_iwslt_de_en"]
UPDATES = 120  # enough for the toy task's words and reordering to show; every arch trains side by side
SCHEDULE = ["--lr", "5e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", 30]
BEAM, MAX_LEN_A, MAX_LEN_B = 4, 1.2, 10  # the depth study's fairseq-generate settings
GENERATE = ["--beam", BEAM, "--max-len-a", MAX_LEN_A, "--max-len-b", MAX_LEN_B, "--cpu",
            "--required-batch-size-multiple", 1]  # fairseq's default 8 can leave sentences out
SPLITS = ("train", "valid", "test")
RAW_TEXT = [  # quotes, a non-breaking prefix, hyphens, a dash, a zero-width space, a final dot after a number
    '„Das ist’s“, sagte Dr. Müller: «Die E-Mail-Adresse kostet 3,50 € – günstig!»',
    "Er wohnt in der Haupt-\u200bstraße 7.",
]


def each_of(tool, argument_lists):
    """``tool ARGS`` for each of the argument lists, one after the other; returns their stdout, in order."""
    return [fairseq_cli(tool, *arguments).stdout for arguments in argument_lists]


def raw_line(line: str) -> str:
    """A toy corpus line as raw text: capitalised, a final full stop, "haus_en" as "haus-en"."""
    text = line.replace("_", "-")
    return text[0].upper() + text[1:] + "."


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A data-prep output built from the toy corpus as the Ding recipe does: raw text pre-processed
    (``ding.preprocess``), joint subword-nmt BPE, ``data-bin/``, and the recipe's stamp."""
    root = tmp_path_factory.mktemp("prepared")
    toy = write_corpus(root / "tmp" / "toy")
    for split in SPLITS:
        for lang in ("de", "en"):
            write_lines(root / "tmp" / f"{split}.raw.{lang}",
                        (raw_line(line) for line in read_lines(toy / f"{split}.{lang}")))
            write_lines(root / "tmp" / f"{split}.{lang}",
                        (ding.preprocess(line, lang) for line in read_lines(root / "tmp" / f"{split}.raw.{lang}")))
    subwords.learn("subword-nmt", [root / "tmp" / "train.de", root / "tmp" / "train.en"], 100, root / "code", 1)
    for split in SPLITS:
        for lang in ("de", "en"):
            write_lines(root / f"{split}.{lang}",
                        subwords.apply("subword-nmt", root / "code", read_lines(root / "tmp" / f"{split}.{lang}"), 1))
    preprocess.main(options.get_preprocessing_parser().parse_args([
        "--source-lang", "de", "--target-lang", "en", "--trainpref", str(root / "train"),
        "--validpref", str(root / "valid"), "--testpref", str(root / "test"), "--destdir", str(root / "data-bin"),
        "--joined-dictionary", "--workers", "1",
    ]))
    stamp_output(root, {"recipe": "ding-de-en", "bpe": "subword-nmt", "bpe_ops": 100, "joined_dictionary": True})
    return root


@pytest.fixture(scope="module")
def trained(prepared, tmp_path_factory):
    """arch -> its last checkpoint after UPDATES updates (2 + 2 layers, tiny dims, dropout on)."""
    save_dirs = {arch: tmp_path_factory.mktemp(arch) for arch in SERVABLE}
    each_of("fairseq-train", [[
        prepared / "data-bin", "--user-dir", USER_DIR, "--arch", arch, "--cpu", *TINY_DIMS,
        "--encoder-layers", 2, "--decoder-layers", 2, "--share-all-embeddings", "--dropout", 0.1,
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", *SCHEDULE,
        *(["--task", "translation_deep"] if "admin" in arch else []),
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1, "--max-tokens", 600,
        "--max-update", UPDATES, "--seed", 1, "--save-dir", save_dir, "--no-epoch-checkpoints",
        "--disable-validation", "--save-interval", 1000,
    ] for arch, save_dir in save_dirs.items()])
    return {arch: save_dir / "checkpoint_last.pt" for arch, save_dir in save_dirs.items()}


@pytest.fixture(scope="module")
def generated(prepared, trained):
    """arch -> fairseq-generate's output on the test set with the original (unexported) checkpoint."""
    outputs = each_of("fairseq-generate", [[prepared / "data-bin", "--user-dir", USER_DIR, "--path", checkpoint,
                                            *GENERATE] for checkpoint in trained.values()])
    return dict(zip(trained, outputs))


def sources(generate_output: str) -> dict:
    return {int(i): text.split() for i, text in re.findall(r"^S-(\d+)\t(.*)$", generate_output, re.M)}


def ctranslate2_hypotheses(model_dir, generate_output: str) -> dict:
    """CTranslate2's hypotheses of fairseq-generate's sources, in one batch as fairseq-generate made them (its
    length limit reads the widest source of the batch)."""
    found = sources(generate_output)
    translator = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=1)
    [translated] = translate_batches(translator, [list(found.values())], BEAM, MAX_LEN_A, MAX_LEN_B)
    return {i: " ".join(tokens) for i, tokens in zip(found, translated)}


def test_every_data_prep_recipe_has_its_raw_text_steps():
    assert RECIPE_TEXT_STEPS.keys() == RECIPES.keys()


@pytest.mark.parametrize("recipe, data_prep", [
    ("iwslt14", recipes.tokenize_lowercase), ("wmt14en2de", recipes.wmt_train_line),
    ("wmt17en2de", recipes.wmt_train_line), ("wmt14en2fr", recipes.wmt_train_line),
    ("ding-de-en", ding.preprocess), ("l10n-de-en", l10n.preprocess),
])
def test_raw_text_steps_are_the_data_preps(recipe, data_prep):
    """What translate.py does to a source line is what the recipe did to its training text."""
    source, target = RECIPES[recipe].languages
    steps = TextProcessing(source, target, recipe, **RECIPE_TEXT_STEPS[recipe])
    assert [steps.preprocess(line) for line in RAW_TEXT] == [data_prep(line, source) for line in RAW_TEXT]


def test_hypotheses_are_joined_and_detokenized():
    bpe = TextProcessing("de", "en", "iwslt14", subword="subword-nmt", **RECIPE_TEXT_STEPS["iwslt14"])
    assert bpe.postprocess("it &apos;s a sm@@ all house , isn &apos;t it ?".split()) == "it's a small house, isn't it?"
    pieces = TextProcessing("de", "en", None, subword="sentencepiece")
    assert pieces.postprocess(["\u2581it", "\u2581is", "\u2581sm", "all", "\u2581."]) == "it is small ."


@pytest.mark.parametrize("arch", SERVABLE)
def test_ctranslate2_float32_writes_fairseq_generate_hypotheses(arch, trained, generated, tmp_path):
    steps = export_ctranslate2(str(trained[arch]), str(tmp_path / "ct2"))
    expected = {i: text for i, (text, _) in hypotheses(generated[arch]).items()}
    found = ctranslate2_hypotheses(tmp_path / "ct2", generated[arch])
    identical = sum(found[i] == text for i, text in expected.items())
    assert len(expected) == 100 and identical >= 95, f"{identical} of 100 identical"

    assert json.loads((tmp_path / "ct2" / "config.json").read_text())["layer_norm_epsilon"] == 1e-5
    assert (steps.recipe, steps.lowercase, steps.subword) == ("ding-de-en", True, "subword-nmt")
    assert {"model.bin", "code", "text_processing.json"} <= {path.name for path in (tmp_path / "ct2").iterdir()}


def test_exported_checkpoint_converts_alike_and_stays_weights_only(trained, prepared, tmp_path):
    original, stock = trained["transformer_admin_iwslt_de_en"], tmp_path / "stock.pt"
    export_checkpoint(str(original), str(stock))
    saved = stock.read_bytes()
    export_main([str(stock), str(tmp_path / "from_stock"), "--format", "ctranslate2"])
    assert stock.read_bytes() == saved and torch.serialization.get_unsafe_globals_in_checkpoint(str(stock)) == []
    export_ctranslate2(str(original), str(tmp_path / "from_original"))
    assert (tmp_path / "from_stock" / "model.bin").read_bytes() == (tmp_path / "from_original" / "model.bin").read_bytes()

    moved = torch.load(stock, weights_only=True)
    moved["cfg"]["task"]["data"] = str(tmp_path / "gone" / "data-bin")
    torch.save(moved, tmp_path / "moved.pt")
    with pytest.raises(ExportError, match=r"no dictionaries \(dict\.\*\.txt\) in .*gone/data-bin, the checkpoint's "
                                          r"data path: name their folder with --data DIR$"):
        export_ctranslate2(str(tmp_path / "moved.pt"), str(tmp_path / "moved"))
    export_ctranslate2(str(tmp_path / "moved.pt"), str(tmp_path / "moved"), "int8", str(prepared / "data-bin"))
    assert (tmp_path / "moved" / "code").read_bytes() == (prepared / "code").read_bytes()
    with pytest.raises(ExportError, match="is not an earlier CTranslate2 export: choose a new or empty OUT_DIR"):
        export_ctranslate2(str(stock), str(prepared))


def test_tfixup_is_refused_in_one_line(prepared, tmp_path):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(prepared / "data-bin"), "--user-dir", USER_DIR, "--cpu",
                                                "--arch", "transformer_tfixup_iwslt_de_en", *map(str, TINY_DIMS),
                                                "--encoder-layers", "1", "--decoder-layers", "1"])
    model = tasks.setup_task(args).build_model(args)
    torch.save(checkpoint_of(model, args), tmp_path / "tfixup.pt")
    result = FORK_SERVER.run([sys.executable, "-m", "deepnmt_plugin.export", tmp_path / "tfixup.pt", tmp_path / "out",
                              "--format", "ctranslate2"], timeout=600)
    assert result.returncode == 1 and not result.stdout and not (tmp_path / "out").exists()
    assert result.stderr.strip().splitlines() == [
        f"deepnmt: error: cannot convert {tmp_path / 'tfixup.pt'} to CTranslate2: transformer_tfixup: T-Fixup has "
        "no LayerNorm, and stock fairseq's transformer normalises every sublayer; serve it with fairseq --user-dir"
    ]


def test_translate_goes_from_raw_text_to_detokenized_fairseq_generate_output(trained, generated, prepared, tmp_path,
                                                                              monkeypatch, capsys):
    export_ctranslate2(str(trained["transformer_admin_iwslt_de_en"]), str(tmp_path / "ct2"))
    raw = list(read_lines(prepared / "tmp" / "test.raw.de"))
    translator = RawTextTranslator(str(tmp_path / "ct2"), threads=1)
    # the same model input as the data-prep wrote for fairseq-preprocess
    assert translator.source_tokens(raw) == [line.split() for line in read_lines(prepared / "test.de")]

    lines = raw[:20] + [""]  # an empty line stays an empty line
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO("".join(line + "\n" for line in lines).encode())))
    translate_main(["--model", str(tmp_path / "ct2"), "--threads", "1"])
    output = capsys.readouterr().out
    translations = output.split("\n")
    assert len(translations) == len(lines) + 1 and translations[-2:] == ["", ""]
    detokenizer = MosesDetokenizer(lang="en")
    expected = {i: detokenizer.detokenize(post_process(text, "subword_nmt").split())
                for i, (text, _) in hypotheses(generated["transformer_admin_iwslt_de_en"]).items()}
    assert sum(translations[i] == expected[i] for i in range(20)) >= 19, list(zip(translations, expected.values()))
    assert translations[0].endswith(".") and "@@" not in output and " ." not in output

    (tmp_path / "ct2" / "code").unlink()  # the subword model the export wrote: translate stops in one line
    with pytest.raises(SystemExit) as stopped:
        translate_main(["--model", str(tmp_path / "ct2"), "--threads", "1"])
    assert stopped.value.code == (f"deepnmt: error: {tmp_path / 'ct2'} lacks its subword model code: export the model "
                                  "again")
