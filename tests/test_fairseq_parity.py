"""fairseq parity: what fairseq's own ``transformer`` supports works the same on the four deep archs.

Our versions of fairseq's own tests (its wheel ships none), parametrised over the deep archs with the stock
``transformer`` as the control, Admin always under ``--task translation_deep``:

* test_export.py: ``torch.jit.script(model)``, and the scripted model computes what the eager one does;
* test_sequence_generator.py, TestJitSequenceGenerator: a scripted ``SequenceGenerator`` of a trained
  checkpoint finds the eager generator's hypotheses;
* test_inference_dropout.py: ``--retain-dropout``, and ``--retain-dropout-modules`` with fairseq's names;
* test_binaries.py, translation cases: LayerDrop with ``--update-freq``, activation checkpointing,
  ``--*-layers-to-keep``, cross-self-attention and generation, through fairseq-train's and fairseq-generate's
  ``cli_main`` run in this process (as fairseq's test_binaries runs them), with tiny models;
* each deep layer, its recipe constants set to neutral values, computes exactly fairseq's layer
  (cross-self-attention included);
* what the archs cannot support is refused at start-up in one line.
"""

import importlib
import json
import re
import sys
from pathlib import Path

import pytest
import torch
from fairseq import checkpoint_utils
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.modules import FairseqDropout
from fairseq.sequence_generator import SequenceGenerator

from conftest import TINY_DIMS, USER_DIR, fairseq_cli
from deepnmt_plugin.models.admin import AdminResidual
from deepnmt_plugin.models.deepnorm import DeepNormResidual, deepnorm_alpha
from tiny_training import RECIPES, WARMUP, hypotheses, last_line
from tiny_training import one_thread_per_process  # noqa: F401  (autouse fixture)

STOCK = "transformer_iwslt_de_en"
DEEP = ["transformer_preln_iwslt_de_en", "transformer_deepnorm_iwslt_de_en", "transformer_tfixup_iwslt_de_en",
        "transformer_admin_iwslt_de_en"]
LATER = [f"transformer_{method}_iwslt_de_en" for method in ("subln", "b2t", "resi_dual", "dlcl", "rezero", "dsinit",
                                                            "periln", "mixln", "lns", "dyt", "hybridnorm",
                                                            "denseformer", "sigma", "hyper")]
ARCHS = [STOCK, *DEEP, *LATER]
TRAINING = {STOCK: WARMUP, **RECIPES, **{arch: WARMUP for arch in LATER}}  # lr, schedule, Admin's task
# DLCL's and DenseFormer's weights index layers by position: they refuse LayerDrop and pruning (tests/test_dlcl.py,
# tests/test_denseformer.py)
LAYER_INDEXED = ["transformer_dlcl_iwslt_de_en", "transformer_denseformer_iwslt_de_en"]
PRUNABLE = [arch for arch in ARCHS if arch not in LAYER_INDEXED]
TASK = {"transformer_admin_iwslt_de_en": ["--task", "translation_deep"]}
ENCODER_LAYERS, DECODER_LAYERS = 3, 2
KEEP = {"encoder_layers_to_keep": "0,2", "decoder_layers_to_keep": "1"}


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """In-process training and generation on one thread: deterministic, and fast beside other jobs."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny(build_model, arch, *flags):
    """A 2+2-layer tiny model in eval mode; Admin's omega set to values far from 1, as after profiling."""
    torch.manual_seed(0)
    model, args = build_model(arch, *TASK.get(arch, []), *TINY_DIMS, "--encoder-layers", 2, "--decoder-layers", 2,
                              *flags)
    if hasattr(model, "admin_initialized"):
        with torch.no_grad():
            for residual in (m for m in model.modules() if isinstance(m, AdminResidual)):
                residual.omega.uniform_(0.5, 2.0)
            model.admin_initialized.fill_(True)
    return model.eval(), args


def random_batch(model, batch=3, src_len=7, tgt_len=6, seed=1):
    generator = torch.Generator().manual_seed(seed)
    vocabulary = len(model.encoder.dictionary)
    src = torch.randint(4, vocabulary, (batch, src_len), generator=generator)
    prev = torch.randint(4, vocabulary, (batch, tgt_len), generator=generator)
    return src, torch.full((batch,), src_len), prev


# test_export.py


@pytest.mark.parametrize("arch", ARCHS)
def test_scripted_model_computes_what_the_eager_one_does(arch, build_model, tmp_path):
    model, _ = tiny(build_model, arch)
    torch.jit.script(model).save(str(tmp_path / "scripted.pt"))
    scripted = torch.jit.load(str(tmp_path / "scripted.pt"))
    batch = random_batch(model)
    with torch.no_grad():
        eager_logits, eager_extra = model(*batch)
        scripted_logits, scripted_extra = scripted(*batch)
    torch.testing.assert_close(scripted_logits, eager_logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(scripted_extra["attn"][0], eager_extra["attn"][0], rtol=0, atol=1e-6)


# test_inference_dropout.py


def dropout_modules(model):
    return {name: m for name, m in model.named_modules() if isinstance(m, FairseqDropout)}


def prepared_for_inference(build_model, arch, retain_dropout_modules=None):
    """As fairseq-generate --retain-dropout [--retain-dropout-modules ...] prepares a model."""
    model, args = tiny(build_model, arch, "--dropout", 0.3)
    args.retain_dropout, args.retain_dropout_modules = True, retain_dropout_modules
    model.prepare_for_inference_(convert_namespace_to_omegaconf(args))
    return model


@pytest.mark.parametrize("arch", ARCHS)
def test_retain_dropout_keeps_every_dropout_on_in_inference(arch, build_model):
    model, _ = tiny(build_model, arch)
    assert not any(m.apply_during_inference for m in dropout_modules(model).values())
    model.train()
    assert all(m.training for m in dropout_modules(model).values())

    model = prepared_for_inference(build_model, arch)
    assert not model.training and all(m.apply_during_inference for m in dropout_modules(model).values())
    batch = random_batch(model)
    assert not torch.equal(model(*batch)[0], model(*batch)[0])  # eval mode, yet stochastic


def encoder_side(model):
    return {name for name in dropout_modules(model)
            if name == "encoder.dropout_module" or name.startswith("encoder.layers.") and name.count(".") == 3}


@pytest.mark.parametrize("arch, names", [
    *[(arch, ["TransformerEncoder", "TransformerEncoderLayerBase"]) for arch in ARCHS],  # what fairseq 0.12 names
    # fairseq's test_inference_dropout.py names; stock 0.12 layers answer only to "TransformerEncoderLayerBase"
    *[(arch, ["TransformerEncoder", "TransformerEncoderLayer"]) for arch in DEEP],
    *[(arch, ["DeepTransformerEncoder", "DeepTransformerEncoderLayer"]) for arch in DEEP],  # ours
])
def test_retain_dropout_modules_by_fairseq_names_and_ours(arch, names, build_model):
    model = prepared_for_inference(build_model, arch, names)
    retained = {name for name, m in dropout_modules(model).items() if m.apply_during_inference}
    assert retained == encoder_side(model)
    assert len(retained) == 1 + 2 * 2  # the encoder's, and each layer's dropout and activation dropout


# refused where the recipe replaces the projections fairseq hooks: test_subln.py, test_hybridnorm.py, test_sigma.py
@pytest.mark.parametrize("arch", [a for a in ARCHS if a not in ("transformer_subln_iwslt_de_en",
                                                                "transformer_hybridnorm_iwslt_de_en",
                                                                "transformer_sigma_iwslt_de_en")])
def test_quant_noise_hooks_the_projections_fairseq_hooks(arch, build_model):
    flags = ("--quant-noise-pq", 0.5, "--quant-noise-pq-block-size", 8, "--dropout", 0)
    model, _ = tiny(build_model, arch, *flags)
    noisy = {name for name, m in model.named_modules() if m._forward_pre_hooks}
    expected = {"fc1", "fc2", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj"}
    assert {name[len("encoder.layers.0."):] for name in noisy if name.startswith("encoder.layers.0.")} == expected
    batch = random_batch(model)
    with torch.no_grad():
        clean = model.eval()(*batch)[0]
        assert torch.equal(model(*batch)[0], clean)
        assert not torch.equal(model.train()(*batch)[0], clean)  # no dropout: the difference is the noise


# Each deep layer is fairseq's layer with the recipe's residual sums and LayerNorm placement.


def neutralised(model):
    """Recipe constants at their neutral values: DeepNorm alpha = 1, Admin omega = 1."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, DeepNormResidual):
                module.alpha = 1.0
            if isinstance(module, AdminResidual):
                module.omega.fill_(1.0)
    return model


def stock_twin(build_model, deep_model, arch, *flags):
    """The stock transformer of the same layout holding the deep model's weights (T-Fixup's absent LayerNorms as
    identities)."""
    pre_ln = ["--encoder-normalize-before", "--decoder-normalize-before"] if "preln" in arch else []
    stock, _ = tiny(build_model, STOCK, *pre_ln, *flags)
    if "tfixup" in arch:
        for layer in [*stock.encoder.layers, *stock.decoder.layers]:
            for name in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"):
                if getattr(layer, name, None) is not None:
                    setattr(layer, name, torch.nn.Identity())
    state = {k: v for k, v in deep_model.state_dict().items() if "omega" not in k and k != "admin_initialized"}
    stock.load_state_dict(state, strict=True)
    return stock


def incremental(model, src, lengths, prev):
    encoder_out = model.encoder(src, src_lengths=lengths)
    state = {}
    steps = [model.decoder(prev[:, : t + 1], encoder_out=encoder_out, incremental_state=state)[0]
             for t in range(prev.size(1))]
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("arch", DEEP)
@pytest.mark.parametrize("flags", [[], ["--cross-self-attention"], ["--no-cross-attention", "--cross-self-attention"]],
                         ids=["default", "cross-self-attention", "cross-self-attention-only"])
def test_deep_layers_compute_fairseqs_layer_at_neutral_constants(arch, flags, build_model):
    model, _ = tiny(build_model, arch, "--dropout", 0, *flags)
    stock = stock_twin(build_model, neutralised(model), arch, "--dropout", 0, *flags)
    src, lengths, prev = random_batch(model)
    with torch.no_grad():
        logits, extra = model(src, lengths, prev)
        stock_logits, stock_extra = stock(src, lengths, prev)
        torch.testing.assert_close(logits, stock_logits, rtol=0, atol=1e-6)
        if "--no-cross-attention" not in flags:
            torch.testing.assert_close(extra["attn"][0], stock_extra["attn"][0], rtol=0, atol=1e-6)
        torch.testing.assert_close(incremental(model, src, lengths, prev), logits, rtol=1e-4, atol=1e-5)
        other_source = random_batch(model, seed=2)[0]
        assert not torch.allclose(model(other_source, lengths, prev)[0], logits)  # the source is read


# test_binaries.py, translation cases: fairseq-train and fairseq-generate's cli_main in this process.


def run_cli(tool, *argv):
    """``fairseq-<tool> ARGV`` as its console script runs it (``fairseq_cli.<tool>.cli_main``), in this process.
    Imported here, not at collection: importing fairseq_cli.train points the root logger at stdout."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", [f"fairseq-{tool}", *map(str, argv)])
        importlib.import_module(f"fairseq_cli.{tool}").cli_main()


def fairseq_train(data, save_dir, arch, *flags):
    run_cli("train", data, "--user-dir", USER_DIR, "--arch", arch, "--cpu", *TINY_DIMS,
            "--share-all-embeddings", "--dropout", 0.1, "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)",
            *TRAINING[arch], "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", 0.1,
            "--max-tokens", 1500, "--seed", 1, "--num-workers", 0, "--save-dir", save_dir, "--no-epoch-checkpoints",
            "--log-format", "simple", *flags)
    return Path(save_dir) / "checkpoint_last.pt"


def fairseq_generate(data, checkpoint, results, *flags):
    run_cli("generate", data, "--user-dir", USER_DIR, "--path", checkpoint, "--cpu",
            "--max-len-a", 1, "--max-len-b", 5, "--required-batch-size-multiple", 1, "--num-workers", 0,
            "--results-path", results, *flags)
    return (Path(results) / "generate-test.txt").read_text()


LAYERDROP = ["--encoder-layers", ENCODER_LAYERS, "--decoder-layers", DECODER_LAYERS, "--encoder-layerdrop", 0.2,
             "--decoder-layerdrop", 0.2, "--update-freq", 2, "--max-update", 4]
_layerdrop_runs = {}


def layerdrop_flags(arch):
    """LAYERDROP, without the LayerDrop itself for the recipes that refuse it."""
    if arch in LAYER_INDEXED:
        return ["--encoder-layers", ENCODER_LAYERS, "--decoder-layers", DECODER_LAYERS, "--update-freq", 2,
                "--max-update", 4]
    return LAYERDROP


@pytest.fixture
def layerdrop_run(toy_data, tmp_path_factory):
    """``arch -> checkpoint`` of a LayerDrop + --update-freq 2 run (seed 1), trained once per session."""

    def run(arch):
        if arch not in _layerdrop_runs:
            _layerdrop_runs[arch] = fairseq_train(toy_data, tmp_path_factory.mktemp(arch), arch, *layerdrop_flags(arch))
        return _layerdrop_runs[arch]

    return run


def load(checkpoint, data, **overrides):
    [model], _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)],
                                                                     arg_overrides={"data": str(data), **overrides})
    return model.eval(), task


@pytest.mark.parametrize("arch", ARCHS)
def test_layerdrop_with_update_freq_trains_and_admin_profiles_every_sublayer_once(arch, layerdrop_run, toy_data):
    checkpoint = layerdrop_run(arch)
    state = torch.load(checkpoint, weights_only=True)
    assert state["optimizer_history"][-1]["num_updates"] == 4
    if "admin" not in arch:
        return
    profile = json.loads((checkpoint.parent / "admin_profile.json").read_text())
    assert [len(profile["omega"][side]) for side in ("encoder", "decoder")] == [2 * ENCODER_LAYERS, 3 * DECODER_LAYERS]
    model, _ = load(checkpoint, toy_data)
    for side in ("encoder", "decoder"):
        trained = [m.omega for m in getattr(model, side).modules() if isinstance(m, AdminResidual)]
        # 4 Adam steps at lr <= 1e-3 move an entry by a few 1e-3, never to another sublayer's value
        moved = [(omega - profiled).abs().max().item() for omega, profiled in zip(trained, profile["omega"][side])]
        assert max(moved) < 0.01


@pytest.mark.parametrize("arch", ARCHS)
def test_activation_checkpointing_trains_exactly_the_same(arch, layerdrop_run, toy_data, tmp_path):
    checkpointed = torch.load(fairseq_train(toy_data, tmp_path, arch, *layerdrop_flags(arch), "--checkpoint-activations"),
                              weights_only=True)
    expected = torch.load(layerdrop_run(arch), weights_only=True)
    assert checkpointed["extra_state"]["val_loss"] == expected["extra_state"]["val_loss"]
    assert checkpointed["model"].keys() == expected["model"].keys()
    for name, parameter in expected["model"].items():  # the recomputed forward sums gradients in another order
        torch.testing.assert_close(checkpointed["model"][name], parameter, rtol=0, atol=1e-4, msg=name)


def kept_by_hand(model, keep):
    """The full model with only the kept layers, each exactly as trained."""
    for side, indices in keep.items():
        stack = getattr(model, side.split("_")[0])
        layers = list(stack.layers.children())
        stack.layers = torch.nn.ModuleList([layers[int(i)] for i in indices.split(",")])
        stack.num_layers = len(stack.layers)
    return model


@pytest.mark.parametrize("arch", PRUNABLE)
def test_layers_to_keep_keeps_the_constants_the_model_was_trained_with(arch, layerdrop_run, toy_data):
    checkpoint = layerdrop_run(arch)
    pruned, task = load(checkpoint, toy_data, **KEEP)
    assert (len(pruned.encoder.layers), len(pruned.decoder.layers)) == (2, 1)
    by_hand, _ = load(checkpoint, toy_data)
    by_hand = kept_by_hand(by_hand, KEEP)
    src, lengths, prev = random_batch(pruned)
    with torch.no_grad():
        torch.testing.assert_close(pruned(src, lengths, prev)[0], by_hand(src, lengths, prev)[0], rtol=0, atol=0)
    if "deepnorm" in arch:  # alpha of the 3+2 layers trained, not of the 2+1 kept
        for side in ("encoder", "decoder"):
            alphas = {m.alpha for m in getattr(pruned, side).modules() if isinstance(m, DeepNormResidual)}
            assert alphas == {deepnorm_alpha(side, ENCODER_LAYERS, DECODER_LAYERS)}


@pytest.mark.parametrize("keep", [{"encoder_layers_to_keep": "0,2"}, {"decoder_layers_to_keep": "1"}],
                         ids=["encoder", "decoder"])
@pytest.mark.parametrize("arch", ["transformer_deepnorm_iwslt_de_en", "transformer_hyper_iwslt_de_en", STOCK])
def test_pruning_one_stack_keeps_every_layer_of_the_other(arch, keep, layerdrop_run, toy_data, tmp_path):
    """The documented form prunes one stack (fairseq 0.12 alone drops the other stack's layers and fails to load)."""
    checkpoint = layerdrop_run(arch)
    pruned, _ = load(checkpoint, toy_data, **keep)
    by_hand = kept_by_hand(load(checkpoint, toy_data)[0], keep)
    assert [len(pruned.encoder.layers), len(pruned.decoder.layers)] == [len(by_hand.encoder.layers),
                                                                         len(by_hand.decoder.layers)]
    src, lengths, prev = random_batch(pruned)
    with torch.no_grad():
        torch.testing.assert_close(pruned(src, lengths, prev)[0], by_hand(src, lengths, prev)[0], rtol=0, atol=0)
    generated = fairseq_generate(toy_data, checkpoint, tmp_path / "generate", "--model-overrides", str(keep))
    assert len(re.findall(r"^H-", generated, re.M)) == 100


@pytest.mark.parametrize("arch", PRUNABLE)
def test_generate_pruned_with_alignment_and_sampling(arch, layerdrop_run, toy_data, tmp_path):
    overrides = str(KEEP)
    beam = fairseq_generate(toy_data, layerdrop_run(arch), tmp_path / "beam", "--model-overrides", overrides,
                            "--beam", 3, "--nbest", 2, "--print-alignment")
    sources = len(re.findall(r"^S-", beam, re.M))
    assert sources == 100 and len(re.findall(r"^H-", beam, re.M)) == len(re.findall(r"^A-", beam, re.M)) == 2 * sources
    sampled = fairseq_generate(toy_data, layerdrop_run(arch), tmp_path / "sampling", "--model-overrides", overrides,
                               "--sampling", "--sampling-topk", 3, "--beam", 2, "--nbest", 2, "--prefix-size", 1,
                               "--retain-dropout", "--retain-dropout-modules",
                               "['TransformerEncoder', 'TransformerEncoderLayer']")
    assert len(re.findall(r"^H-", sampled, re.M)) == 2 * sources


@pytest.mark.parametrize("arch", ARCHS)
def test_scripted_generator_finds_the_eager_hypotheses(arch, layerdrop_run, toy_data):
    model, task = load(layerdrop_run(arch), toy_data)
    task.load_dataset("test")
    dataset = task.dataset("test")
    sample = dataset.collater([dataset[i] for i in range(24)])
    net_input = {k: sample["net_input"][k] for k in ("src_tokens", "src_lengths")}
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=2, max_len_b=10)
    scripted = torch.jit.script(generator)
    eager, found = generator.forward({"net_input": net_input}), scripted({"net_input": net_input})
    assert len(eager) == len(found) == 24
    for eager_hypos, scripted_hypos in zip(eager, found):
        assert [h["tokens"].tolist() for h in scripted_hypos] == [h["tokens"].tolist() for h in eager_hypos]
        torch.testing.assert_close(torch.stack([h["score"] for h in scripted_hypos]),
                                   torch.stack([h["score"] for h in eager_hypos]), rtol=0, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS)
def test_cross_self_attention_trains_and_generates(arch, toy_data, tmp_path):
    checkpoint = fairseq_train(toy_data, tmp_path / "checkpoints", arch, "--encoder-layers", 1, "--decoder-layers", 1,
                               "--no-cross-attention", "--cross-self-attention", "--max-update", 2)
    generated = hypotheses(fairseq_generate(toy_data, checkpoint, tmp_path / "generated", "--beam", 2))
    assert len(generated) == 100


# Refused at start-up, in one line


@pytest.mark.parametrize("arch", DEEP + LATER)
@pytest.mark.parametrize("flags, message", [
    (["--encoder-layers", -2], "--encoder-layers -2: --arch {arch} needs at least 1 layer"),
    (["--decoder-layers", 0], "--decoder-layers 0: --arch {arch} needs at least 1 layer"),
    (["--encoder-layers-to-keep", "0,1"],
     "--encoder-layers-to-keep prunes a trained model when it is loaded: give it to fairseq-generate as "
     "--model-overrides \"{{'encoder_layers_to_keep': '0,1'}}\""),
    (["--base-layers", 1], "--base-layers is not supported by --arch {arch}: BASE layers keep fairseq's own residual"),
    (["--adaptive-input"], "--adaptive-input is not supported by --arch {arch}: fairseq's translation transformer"),
    (["--tie-adaptive-weights"], "--tie-adaptive-weights is not supported by --arch {arch}: it ties"),
    (["--char-inputs"], "--char-inputs is not supported by --arch {arch}: a deprecated fairseq flag"),
    (["--relu-dropout", 0.1], "--relu-dropout is not supported by --arch {arch}: fairseq 0.12's transformer never "
                              "reads it; give the FFN's dropout as --activation-dropout"),
])
def test_unsupported_flags_refused_in_one_line(arch, flags, message, build_model):
    if arch in LAYER_INDEXED and "--encoder-layers-to-keep" in flags:  # no advice to prune a model that cannot be
        message = "encoder_layers_to_keep is not supported by --arch {arch}: every "
    with pytest.raises(SystemExit) as refused:
        build_model(arch, *TASK.get(arch, []), *flags)
    assert str(refused.value.code).startswith("deepnmt: error: " + message.format(arch=arch))
    assert "\n" not in str(refused.value.code)


def test_shared_embeddings_over_two_dictionaries_are_refused_in_one_line(toy_data, tmp_path):
    """fairseq raises a ValueError from inside build_model; our archs refuse before building."""
    import shutil

    from fairseq import options, tasks

    data = tmp_path / "data-bin"
    shutil.copytree(toy_data, data)
    dictionary = (data / "dict.en.txt").read_text().splitlines()
    (data / "dict.en.txt").write_text("\n".join(dictionary[:-1]) + "\n")  # no longer the German one
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", USER_DIR, "--arch", "transformer_preln_iwslt_de_en", "--cpu",
        "--share-all-embeddings"])
    with pytest.raises(SystemExit) as refused:
        tasks.setup_task(args).build_model(args)
    assert str(refused.value.code) == (
        "deepnmt: error: --share-all-embeddings needs one dictionary for both languages: binarize with "
        "fairseq-preprocess --joined-dictionary (or --srcdict and --tgtdict naming one file), or drop the flag")


def test_layers_to_keep_out_of_range_refused_when_loading(layerdrop_run, toy_data):
    refused = r"^deepnmt: error: encoder_layers_to_keep 0,3: the model has layers 0 \.\. 2$"
    with pytest.raises(SystemExit, match=refused):
        load(layerdrop_run("transformer_deepnorm_iwslt_de_en"), toy_data, encoder_layers_to_keep="0,3")


ADMIN = ["--user-dir", USER_DIR, "--arch", "transformer_admin_iwslt_de_en", "--cpu", *TINY_DIMS, "--optimizer", "adam",
         "--lr", 1e-3, "--max-tokens", 1500, "--max-update", 2]


@pytest.mark.slow
def test_admin_refusals_exit_1_in_one_line_without_a_traceback(toy_data, tmp_path):
    for flags, message in [
        (["--task", "translation_deep", "--encoder-layers", -2],
         "deepnmt: error: --encoder-layers -2: --arch transformer_admin_iwslt_de_en needs at least 1 layer"),
        ([], "deepnmt: error: transformer_admin trains with --task translation_deep, which sets omega before the "
             "first update; this model's omega is still 1 (plain Post-LN)"),
    ]:
        result = fairseq_cli("fairseq-train", toy_data, *ADMIN, "--save-dir", tmp_path, *flags, check=False)
        assert result.returncode == 1, result.stderr[-2000:]  # not 134: no SIGABRT after the message
        assert last_line(result.stderr) == message
        assert "Traceback" not in result.stderr and "terminate called" not in result.stderr
        assert not (tmp_path / "checkpoint_last.pt").exists()


def test_admin_checkpoint_fine_tunes_under_plain_translation(layerdrop_run, toy_data, tmp_path):
    """Only an Admin model whose omega nothing sets is refused: a trained one trains on under any task."""
    admin = layerdrop_run("transformer_admin_iwslt_de_en")
    run_cli("train", toy_data, *ADMIN, "--encoder-layers", ENCODER_LAYERS,
            "--decoder-layers", DECODER_LAYERS, "--share-all-embeddings", "--finetune-from-model", admin,
            "--num-workers", 0, "--save-dir", tmp_path, "--no-epoch-checkpoints")
    assert torch.load(tmp_path / "checkpoint_last.pt", weights_only=True)["optimizer_history"][-1]["num_updates"] == 2
