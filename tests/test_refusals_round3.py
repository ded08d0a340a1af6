"""Silent wrong results turned into refusals or whole results: averaging checkpoints of different models that share
parameter names, converting a ``--cross-self-attention`` model to CTranslate2, scoring text that holds a tab or a lone
carriage return; and one line where a traceback was (a huge sentence id, an unknown sacreBLEU test set, a reproduction
config missing, malformed or a list)."""

import pytest
import torch

from conftest import TINY_DIMS
from deepnmt_plugin import average_checkpoints, export, scoring
from tiny_training import checkpoint_of, files_in
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

ONE_LAYER = [*TINY_DIMS, "--encoder-layers", 1, "--decoder-layers", 1]


def refused(command) -> str:
    """The one line a main(argv) or a function stopped with (a SystemExit carrying it)."""
    with pytest.raises(SystemExit) as stopped:
        command()
    message = stopped.value.code
    assert isinstance(message, str) and len(message.splitlines()) == 1 and message.startswith("deepnmt: error: ")
    return message


# --- averaging: one model only -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def save_checkpoint(build_model, tmp_path_factory):
    """``save_checkpoint(name, arch, *flags)``: an untrained one-layer model saved as fairseq-train saves it."""
    directory = tmp_path_factory.mktemp("checkpoints")

    def save(name, arch, *flags):
        model, args = build_model(arch, *ONE_LAYER, *flags)
        path = directory / f"{name}.pt"
        torch.save(checkpoint_of(model, args), path)
        return path

    return save


@pytest.mark.parametrize("arch, flags, other_arch, other_flags, differences", [
    ("transformer_deepnorm_iwslt_de_en", [], "transformer_b2t_iwslt_de_en", [],
     "arch transformer_deepnorm_iwslt_de_en vs transformer_b2t_iwslt_de_en, deep_method deepnorm vs b2t"),
    ("transformer_deepnorm_iwslt_de_en", [], "transformer_dsinit_iwslt_de_en", [],
     "arch transformer_deepnorm_iwslt_de_en vs transformer_dsinit_iwslt_de_en, deep_method deepnorm vs dsinit"),
    ("transformer_iwslt_de_en", [], "transformer_dsinit_iwslt_de_en", [],
     "arch transformer_iwslt_de_en vs transformer_dsinit_iwslt_de_en"),  # stock fairseq records no deep_method
    ("transformer_dsinit_iwslt_de_en", ["--dsinit-bound", "paper"], "transformer_dsinit_iwslt_de_en",
     ["--dsinit-bound", "code"], "dsinit_bound paper vs code"),
    ("transformer_mixln_iwslt_de_en", [], "transformer_mixln_iwslt_de_en", ["--mixln-alpha", 0.5],
     "mixln_alpha None vs 0.5"),
    ("transformer_dyt_iwslt_de_en", ["--dyt-alpha-init", 0.5], "transformer_dyt_iwslt_de_en",
     ["--dyt-alpha-init", 1.0], "dyt_alpha_init 0.5 vs 1.0"),
    ("transformer_resi_dual_iwslt_de_en", [], "transformer_resi_dual_iwslt_de_en", ["--enc-alpha", 0.5],
     "enc_alpha None vs 0.5"),
    ("transformer_admin_iwslt_de_en", [], "transformer_admin_iwslt_de_en", ["--admin-linear-init", "fairseq"],
     "admin_linear_init None vs fairseq"),  # one run trains under one init, which its checkpoints name
    ("transformer_preln_iwslt_de_en", [], "transformer_preln_iwslt_de_en", ["--encoder-ffn-embed-dim", 256],
     "encoder_ffn_embed_dim 128 vs 256"),  # the same names, other shapes: it failed in a traceback
], ids=["deepnorm-b2t", "deepnorm-dsinit", "stock-dsinit", "dsinit-bound", "mixln-alpha", "dyt-alpha",
        "resi-dual-alpha", "admin-linear-init", "ffn-dim"])
def test_average_refuses_checkpoints_of_different_models_that_share_parameter_names(
        arch, flags, other_arch, other_flags, differences, save_checkpoint, tmp_path):
    first, other = save_checkpoint(f"{arch}-a", arch, *flags), save_checkpoint(f"{other_arch}-b", other_arch,
                                                                               *other_flags)
    assert list(torch.load(first)["model"]) == list(torch.load(other)["model"])  # only the config tells them apart
    output = tmp_path / "averaged.pt"
    assert refused(lambda: average_checkpoints.main(["--inputs", str(first), str(other), "--output", str(output)])) == (
        f"deepnmt: error: {first} and {other} are checkpoints of different models ({differences}); average "
        "checkpoints of one model")
    assert files_in(tmp_path) == []


def test_average_refuses_tensors_of_different_shapes_in_one_line(save_checkpoint, tmp_path):
    """The same flags over another dictionary: the embedding tables differ in size (a RuntimeError before)."""
    first, other = save_checkpoint("vocabulary-a", "transformer_preln_iwslt_de_en"), tmp_path / "vocabulary-b.pt"
    state = torch.load(first)
    state["model"]["encoder.embed_tokens.weight"] = torch.cat([state["model"]["encoder.embed_tokens.weight"]] * 2)
    torch.save(state, other)
    output = tmp_path / "averaged.pt"
    rows = state["model"]["encoder.embed_tokens.weight"].shape
    line = refused(lambda: average_checkpoints.main(["--inputs", str(first), str(other), "--output", str(output)]))
    assert line == (f"deepnmt: error: encoder.embed_tokens.weight is ({rows[0] // 2}, {rows[1]}) in {first} but "
                    f"({rows[0]}, {rows[1]}) in {other}: checkpoints of different models; average checkpoints of one "
                    "model")
    assert not output.exists()


def test_average_takes_checkpoints_of_one_run_whose_training_flags_differ(save_checkpoint, tmp_path):
    """A run resumed with other training flags (dropout, learning rate, updates, directories) is still one model."""
    first = save_checkpoint("first", "transformer_deepnorm_iwslt_de_en", "--dropout", 0.3)
    resumed = save_checkpoint("resumed", "transformer_deepnorm_iwslt_de_en", "--dropout", 0.1,
                              "--attention-dropout", 0.1, "--encoder-layerdrop", 0.2, "--checkpoint-activations",
                              "--lr", 0.1, "--max-update", 99, "--save-dir", tmp_path / "elsewhere")
    state = torch.load(resumed)
    state["model"] = {name: tensor + 1 if tensor.is_floating_point() else tensor
                      for name, tensor in state["model"].items()}
    torch.save(state, resumed)
    output = tmp_path / "averaged.pt"
    average_checkpoints.main(["--inputs", str(first), str(resumed), "--output", str(output)])
    averaged, inputs = torch.load(output)["model"], (torch.load(first)["model"], state["model"])
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (inputs[0][name] + inputs[1][name]) / 2)


# --- CTranslate2: --cross-self-attention ------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ["transformer_iwslt_de_en", "transformer_preln_iwslt_de_en"])
def test_ctranslate2_refuses_a_cross_self_attention_model(arch, save_checkpoint, tmp_path):
    """CTranslate2's decoder self-attention reads the target alone: the converted model translated otherwise."""
    checkpoint = save_checkpoint(f"{arch}-cross-self-attention", arch, "--cross-self-attention")
    output = tmp_path / "ct2"
    assert refused(lambda: export.main([str(checkpoint), str(output), "--format", "ctranslate2"])) == (
        f"deepnmt: error: cannot convert {checkpoint} to CTranslate2: it was trained with --cross-self-attention, "
        "whose decoder self-attention reads the source and the target, and CTranslate2's reads the target only; "
        "serve it with fairseq")
    assert files_in(tmp_path) == []


@pytest.mark.parametrize("flags, reason", [
    (["--no-cross-attention"], "--no-cross-attention, and every CTranslate2 decoder layer attends to the encoder"),
    (["--decoder-output-dim", 32], "--decoder-output-dim, a projection of the decoder output to another width, which "
                                   "CTranslate2 does not have"),
    (["--adaptive-softmax-cutoff", "20,40"], "--adaptive-softmax-cutoff, an adaptive softmax output, which CTranslate2 "
                                             "does not compute"),
], ids=["no-cross-attention", "decoder-output-dim", "adaptive-softmax"])
def test_ctranslate2_refuses_what_its_transformer_does_not_compute_in_one_line(flags, reason, save_checkpoint, tmp_path):
    """The converter crashed on these in a traceback (an AttributeError on a missing module)."""
    checkpoint = save_checkpoint(f"preln-{flags[0]}", "transformer_preln_iwslt_de_en", *flags)
    output = tmp_path / "ct2"
    assert refused(lambda: export.main([str(checkpoint), str(output), "--format", "ctranslate2"])) == (
        f"deepnmt: error: cannot convert {checkpoint} to CTranslate2: it was trained with {reason}; serve it with "
        "fairseq")
    assert files_in(tmp_path) == []


# --- scoring: the whole text of each line ------------------------------------------------------------------------

SENTENCES = ["the red house sees a small cat near the old river", "a good child finds a blue book on the table"]


def scores(tmp_path, capsys, hypotheses, references, newline="\n") -> dict:
    """``python -m deepnmt_plugin.scoring``'s scores of fairseq-generate output holding these texts."""
    lines = []
    for i, (hypothesis, reference) in enumerate(zip(hypotheses, references)):
        lines += [f"S-{i}\t{reference}", f"T-{i}\t{reference}", f"H-{i}\t-0.25\t{hypothesis}",
                  f"D-{i}\t-0.25\t{hypothesis}", f"P-{i}\t-0.2 -0.3"]
    path = tmp_path / "generate.txt"
    path.write_bytes("".join(line + newline for line in lines).encode())
    assert scoring.main([str(path), "--target-lang", "en"]) == 0
    return dict(line.split("\t") for line in capsys.readouterr().out.splitlines())


@pytest.mark.parametrize("separator", ["\t", "\r"], ids=["tab", "carriage-return"])
def test_scoring_keeps_a_hypothesis_whole_past_a_tab_or_a_lone_carriage_return(separator, tmp_path, capsys):
    """A hypothesis cut there scored below 100 against the reference it equals but for that whitespace."""
    texts = [sentence.replace(" a ", f" a{separator}") for sentence in SENTENCES]
    found = scores(tmp_path, capsys, texts, SENTENCES)
    assert (found["bleu_tokenized"], found["sacrebleu"], found["sentences"]) == ("100.0", "100.0", "2")


@pytest.mark.parametrize("separator", ["\t", "\r"], ids=["tab", "carriage-return"])
def test_scoring_keeps_a_reference_whole_past_a_tab_or_a_lone_carriage_return(separator, tmp_path, capsys):
    """A reference cut there matched a hypothesis of its first half alone: 100."""
    references = [sentence.replace(" a ", f" a{separator}") for sentence in SENTENCES]
    halves = [reference.split(separator)[0] for reference in references]
    found = scores(tmp_path, capsys, halves, references)
    assert float(found["bleu_tokenized"]) < 50 and float(found["sacrebleu"]) < 50
    assert scoring.read_generate_output(str(tmp_path / "generate.txt"))[1] == references


def test_scoring_still_reads_crlf_line_ends(tmp_path, capsys):
    found = scores(tmp_path, capsys, SENTENCES, SENTENCES, newline="\r\n")
    assert (found["bleu_tokenized"], found["sentences"]) == ("100.0", "2")
    assert scoring.read_generate_output(str(tmp_path / "generate.txt")) == (SENTENCES, SENTENCES)


# --- one line where a traceback was -------------------------------------------------------------------------------

def test_scoring_a_stray_huge_sentence_id_is_refused_in_one_line(tmp_path):
    """The scorer named the missing ids by building the whole id range: a MemoryError for one id of 10^11."""
    path = tmp_path / "generate.txt"
    path.write_text("T-99999999999\ta house\nH-99999999999\t-0.1\ta house\n")
    assert refused(lambda: scoring.main([str(path), "--target-lang", "en"])) == (
        f"deepnmt: error: {path} holds 1 of the 100000000000 test sentences (missing 0, 1, 2, 3, 4 and 99999999994 "
        "more): refusing a partial BLEU (fairseq-generate without the plugin leaves out a last batch whose size is not "
        "a multiple of --required-batch-size-multiple: pass 1, or --user-dir deepnmt_plugin)")


@pytest.mark.parametrize("test_set, message", [
    ("wmt99/xx", "--sacrebleu-test-set wmt99/xx: sacreBLEU knows no such test set"),
    ("wmt14/full", "--sacrebleu-test-set wmt14/full has no de-xx references"),
])
def test_scoring_refuses_an_unknown_sacrebleu_test_set_in_one_line(test_set, message, tmp_path):
    path = tmp_path / "generate.txt"
    path.write_text("T-0\ta house\nH-0\t-0.1\ta house\n")
    line = refused(lambda: scoring.main([str(path), "--source-lang", "de", "--target-lang", "xx",
                                         "--sacrebleu-test-set", test_set]))
    assert line.startswith(f"deepnmt: error: {message}")


@pytest.mark.parametrize("text, message", [
    (None, "cannot read the table's config {path}: No such file or directory"),
    ("a: [\n", "{path} is not YAML: while parsing a flow node"),
    ("- admin\n- deepnorm\n", "{path} holds a list, not a table's config"),
])
def test_a_reproduction_config_that_is_missing_malformed_or_a_list_is_refused_in_one_line(text, message, tmp_path):
    from deepnmt_plugin import reproduce

    path = tmp_path / "table.yaml"
    if text is not None:
        path.write_text(text)
    line = refused(lambda: reproduce.main([str(path), "--data", str(tmp_path), "--dry-run"]))
    assert line.startswith("deepnmt: error: " + message.format(path=path))
