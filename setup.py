"""deepnmt: the published ways to train deep Transformers (Admin, DeepNorm, T-Fixup, Pre-LN, Sub-LN, B2T,
ResiDual, DLCL, ReZero, DS-Init, Peri-LN, Mix-LN, LayerNorm Scaling, DyT, HybridNorm, DenseFormer, σReparam) as a
fairseq plugin.

Install with ``bash scripts/install.sh`` (it installs torch and fairseq-fixed first, in the order
their builds need); ``pip install --no-build-isolation -e .`` alone works once those are present.
"""

from setuptools import find_packages, setup

setup(
    name="deepnmt",
    version="0.1.0",
    description="Deep Transformer recipes (Admin, DeepNorm, T-Fixup, Pre-LN, Sub-LN, B2T, ResiDual, DLCL, ReZero, DS-Init, "
                "Peri-LN, Mix-LN, LayerNorm Scaling, DyT, HybridNorm, DenseFormer, σReparam) for fairseq NMT",
    packages=find_packages(include=["deepnmt_plugin", "deepnmt_plugin.*"]),
    # torch 2.13 needs Python >= 3.10; 3.11 runs the full suite in CI, 3.13 the fast loop, 3.12 was measured by hand
    # (docs/install.md)
    python_requires=">=3.10",
    classifiers=[f"Programming Language :: Python :: 3.{minor}" for minor in (10, 11, 12, 13)],
    install_requires=[
        # torch is left unpinned so a CUDA build already installed is kept; scripts/install.sh
        # installs torch==2.13.0 only when none is present.
        "torch",
        # fairseq 0.12.2 does not import on Python 3.11; fairseq-fixed is the same code, fixed.
        "fairseq-fixed==0.12.3.1",
        # numpy 1.x or 2.x: compat.py brings back the numpy names fairseq 0.12 still calls.
        "numpy",
        "sacrebleu>=2.3",
        "sacremoses>=0.1",
        "sentencepiece",
        "subword-nmt",
        "regex",
        "tensorboardX",  # fairseq's --tensorboard-logdir (and its import-time notice without it)
        "matplotlib",  # the benchmarks' plots
        # deepnmt-export --format ctranslate2 and python -m deepnmt_plugin.translate; its CPU wheel brings no torch.
        # Pinned: serving.py reuses the fairseq converter's helpers (_get_model_spec, set_transformer_*).
        "ctranslate2==4.8.5",
    ],
    # pytest-xdist runs the tests on every core (pytest.ini); the authors' packages the tests compare our layers with
    # (torchscale: scripts/install.sh, without its deps; x-transformers for Peri-LN's sandwich norm and DyT;
    # hyper-connections for Hyper-Connections and mHC)
    extras_require={"test": ["pytest", "pytest-xdist>=3.5", "rezero==0.1.0", "admin-torch==0.1.0",
                             "x-transformers==2.31.10", "hyper-connections==0.4.11"]},
    entry_points={"console_scripts": [
        "deepnmt-user-dir=deepnmt_plugin.cli:print_user_dir",
        "deepnmt-export=deepnmt_plugin.export:main",
    ]},
)
