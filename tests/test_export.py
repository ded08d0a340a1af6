"""Export to a stock fairseq transformer: same outputs, same fairseq-generate hypotheses in a process
that cannot import the plugin (so torch's weights-only loading runs without its allowlist), and
loading plugin checkpoints from Python."""

import json
import os
import sys

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.models.transformer import TransformerModel

from conftest import FORK_SERVER, TINY_DIMS, USER_DIR, fairseq_cli
from deepnmt_plugin import compat
from deepnmt_plugin.export import ExportError, export, export_checkpoint
from deepnmt_plugin.models.method import METHODS
from tiny_training import checkpoint_of, hypotheses, straight_run
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.slow  # trains, generates or builds corpora through subprocesses

EXPORTABLE = ["transformer_deepnorm_iwslt_de_en", "transformer_preln_iwslt_de_en", "transformer_admin_iwslt_de_en"]
GENERATE = ["--beam", 4, "--cpu", "--max-len-a", 1, "--max-len-b", 5]  # short: barely trained models repeat
# fairseq-generate with the plugin made unimportable: stock fairseq alone must load and run the export.
STOCK_GENERATE = (
    "import sys; sys.modules['deepnmt_plugin'] = None; sys.argv[0] = 'fairseq-generate'; "
    "from fairseq_cli.generate import cli_main; cli_main()"
)


@pytest.fixture(scope="module")
def trained(toy_data, tmp_path_factory):
    return {arch: straight_run(toy_data, tmp_path_factory, arch) / "checkpoint_last.pt" for arch in EXPORTABLE}


@pytest.fixture(scope="module")
def generated(trained, toy_data):
    """fairseq-generate's hypotheses for each original checkpoint, with the plugin."""
    return {arch: hypotheses(fairseq_cli("fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path", path,
                                         *GENERATE).stdout)
            for arch, path in trained.items()}


def outputs_on_tokens(model, sample, pad):
    """Decoder outputs at the target positions that hold tokens: the ones loss and search read."""
    model.eval()
    with torch.no_grad():
        logits = model(**sample["net_input"])[0]
    return logits[sample["net_input"]["prev_output_tokens"].ne(pad)]


def assert_same_function(original_path, exported_path, toy_data):
    data = {"data": str(toy_data)}
    [original], _, task = checkpoint_utils.load_model_ensemble_and_task([str(original_path)], arg_overrides=data)
    [stock], _ = checkpoint_utils.load_model_ensemble([str(exported_path)], task=task)
    assert type(stock) is TransformerModel and type(original) is not TransformerModel
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    sample = dataset.collater([dataset[i] for i in range(64)])
    pad = task.target_dictionary.pad()
    difference = (outputs_on_tokens(original, sample, pad) - outputs_on_tokens(stock, sample, pad)).abs().max()
    assert difference < 1e-4, f"max abs difference {difference}"


def texts(found):
    return {i: text for i, (text, _) in found.items()}


@pytest.mark.parametrize("arch", EXPORTABLE)
def test_export_computes_the_same_and_generates_the_same_without_the_plugin(arch, trained, generated, toy_data,
                                                                             tmp_path):
    exported = tmp_path / "exported.pt"
    export_checkpoint(str(trained[arch]), str(exported))
    assert_same_function(trained[arch], exported, toy_data)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # stock fairseq drops a last batch whose size is not a multiple of --required-batch-size-multiple; the plugin not
    stock = FORK_SERVER.run([sys.executable, "-c", STOCK_GENERATE, toy_data, "--path", exported, *GENERATE,
                             "--required-batch-size-multiple", 1], cwd=tmp_path, env=env, timeout=600)
    assert stock.returncode == 0, stock.stderr[-3000:]
    expected, found = generated[arch], hypotheses(stock.stdout)
    assert len(expected) == 100 and texts(found) == texts(expected)
    assert max(abs(found[i][1] - score) for i, (_, score) in expected.items()) < 1e-4


def test_console_script_writes_what_the_function_does(trained, tmp_path):
    source = trained["transformer_deepnorm_iwslt_de_en"]
    fairseq_cli("deepnmt-export", source, tmp_path / "script.pt")
    export_checkpoint(str(source), str(tmp_path / "function.pt"))
    script, function = (torch.load(tmp_path / name, weights_only=True) for name in ("script.pt", "function.pt"))
    assert script["cfg"]["model"]["arch"] == "transformer_iwslt_de_en" and "deep_method" not in script["cfg"]["model"]
    assert script["model"].keys() == function["model"].keys()
    assert all(torch.equal(script["model"][k], function["model"][k]) for k in script["model"])


def randomized_admin(build_model, *flags):
    """An Admin model whose omegas and LayerNorm affines are far from 1 and 0, so every fold shows."""
    model, args = build_model("transformer_admin_iwslt_de_en", "--task", "translation_deep", *TINY_DIMS,
                              "--encoder-layers", 2, "--decoder-layers", 2, *flags)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("omega") or "layer_norm" in name or "layernorm" in name:
                parameter.copy_(torch.empty(parameter.shape).uniform_(0.5, 2.0, generator=generator))
        model.admin_initialized.fill_(True)
    return model, args


@pytest.mark.parametrize("flags", [
    ["--share-all-embeddings"],  # sinusoidal positions become a learned table; tables untied
    ["--encoder-learned-pos", "--decoder-learned-pos"],  # separate tables and output projection
    ["--share-decoder-input-output-embed", "--layernorm-embedding"],  # omega_1 goes into the embedding LN
    ["--share-all-embeddings", "--no-token-positional-embeddings"],
], ids=["sinusoidal-shared", "learned-unshared", "layernorm-embedding", "no-positions"])
def test_admin_export_is_exact_for_every_embedding_layout(flags, build_model, toy_data, tmp_path):
    model, args = randomized_admin(build_model, *flags)
    original, exported = tmp_path / "admin.pt", tmp_path / "exported.pt"
    torch.save(checkpoint_of(model, args), original)
    export_checkpoint(str(original), str(exported))
    assert not any("omega" in name for name in torch.load(exported, weights_only=True)["model"])
    assert_same_function(original, exported, toy_data)


@pytest.mark.parametrize("method", ["tfixup", "rezero", "subln", "b2t", "resi_dual", "dlcl", "periln", "mixln", "dyt",
                                    "hybridnorm", "denseformer", "sigma", "hyper"])
def test_recipes_without_a_stock_layout_are_refused_in_one_line(method, build_model):
    model, args = build_model(f"transformer_{method}_iwslt_de_en", *TINY_DIMS, "--encoder-layers", 1,
                              "--decoder-layers", 1)
    with pytest.raises(ExportError) as refused:
        export(checkpoint_of(model, args), "model.pt")
    assert str(refused.value) == (f"deepnmt: error: cannot export model.pt: transformer_{method}: "
                                  f"{METHODS[method].export_refusal}; serve it with --user-dir")


def test_lns_exports_as_pre_ln_with_its_scales_folded_into_the_layer_norms(build_model, toy_data, tmp_path):
    model, args = build_model("transformer_lns_iwslt_de_en", *TINY_DIMS, "--encoder-layers", 3, "--decoder-layers", 2)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # affines away from 1 and 0, so that a scale folded into the wrong one shows
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.copy_(torch.empty(parameter.shape).uniform_(0.5, 2.0, generator=generator))
    original, exported = tmp_path / "lns.pt", tmp_path / "exported.pt"
    torch.save(checkpoint_of(model, args), original)
    export_checkpoint(str(original), str(exported))
    stock = torch.load(exported, weights_only=True)
    assert stock["cfg"]["model"]["arch"] == "transformer_iwslt_de_en"
    assert stock["cfg"]["model"]["encoder_normalize_before"] and stock["cfg"]["model"]["decoder_normalize_before"]
    assert_same_function(original, exported, toy_data)


def test_dsinit_exports_as_the_post_ln_model_it_is(build_model, toy_data, tmp_path):
    model, args = build_model("transformer_dsinit_iwslt_de_en", *TINY_DIMS, "--encoder-layers", 2,
                              "--decoder-layers", 2)
    exported = export(checkpoint_of(model, args), "dsinit.pt")
    assert exported["cfg"]["model"]["arch"] == "transformer_iwslt_de_en"
    assert exported["model"].keys() == model.state_dict().keys()


def test_what_cannot_be_exported_is_refused_with_one_line(build_model, trained, tmp_path):

    admin, args = randomized_admin(build_model, "--decoder-output-dim", 32)
    with pytest.raises(ExportError, match="^deepnmt: error: cannot export Admin with decoder.project_out_dim.weight"):
        export(checkpoint_of(admin, args))
    admin, args = randomized_admin(build_model)
    with torch.no_grad():
        admin.decoder.layers[1].encoder_attn_residual.omega[3] = 0
    with pytest.raises(ExportError, match="decoder.layers.1.encoder_attn_residual.omega has a zero entry"):
        export(checkpoint_of(admin, args))
    state = checkpoint_of(admin, args)
    state["cfg"]["model"].unpicklable = object()
    with pytest.raises(ExportError, match=r"cannot export cfg\['model'\]\['unpicklable'\]: object is not a plain"):
        export(state)

    exported = tmp_path / "exported.pt"
    export_checkpoint(str(trained["transformer_preln_iwslt_de_en"]), str(exported))
    with pytest.raises(ExportError, match=r"is not a deepnmt checkpoint \(arch transformer_iwslt_de_en\)"):
        export(compat.read_checkpoint(str(exported)), str(exported))
    with pytest.raises(ExportError, match="refusing to overwrite the checkpoint being exported"):
        export_checkpoint(str(exported), str(exported))


FROM_PRETRAINED = """
import json, sys
from fairseq.models.transformer import TransformerModel
directory, data, user_dir, sentences = sys.argv[1:5]
hub = TransformerModel.from_pretrained(directory, checkpoint_file="checkpoint_last.pt", data_name_or_path=data,
                                       user_dir=user_dir)
print(json.dumps(hub.translate(open(sentences).read().splitlines(), beam=4, max_len_a=1, max_len_b=5)))
"""


@pytest.mark.parametrize("arch", ["transformer_admin_iwslt_de_en", "transformer_resi_dual_iwslt_de_en",
                                  "transformer_dlcl_iwslt_de_en"])
def test_from_pretrained_with_user_dir_translates_like_fairseq_generate(arch, generated, toy_data, tmp_path_factory):
    """A fresh Python process: ``user_dir=`` registers the plugin (archs and checkpoint loading) first."""
    checkpoint = straight_run(toy_data, tmp_path_factory, arch) / "checkpoint_last.pt"
    sentences = toy_data.parent / "raw" / "test.de"
    result = FORK_SERVER.run([sys.executable, "-c", FROM_PRETRAINED, checkpoint.parent, toy_data, USER_DIR, sentences],
                             timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    translations = json.loads(result.stdout.strip().splitlines()[-1])
    expected = texts(generated[arch] if arch in generated else hypotheses(fairseq_cli(
        "fairseq-generate", toy_data, "--user-dir", USER_DIR, "--path", checkpoint, *GENERATE).stdout))
    assert len(translations) == 100 and expected == {i: translations[i] for i in expected}
