"""Peri-LN (Kim et al., ICML 2025, "Peri-LN: Revisiting Layer Normalization in the Transformer Architecture").

Eq. 3: ``x_{l+1} = x_l + Norm(Module(Norm(x_l)))`` on every sublayer, cross-attention included: Pre-LN's input
LayerNorm plus an output LayerNorm on the branch, before the residual sum (and before dropout, as OLMo 2 and
x-transformers' ``sandwich_norm`` apply it). As in the paper's Peri-LN, the embedding output is normalised
(``y_0 = Norm(x_embed)``, fairseq's ``--layernorm-embedding``, which the arch sets) and each stack ends with a final
LayerNorm, as Pre-LN. No official code; the block equals x-transformers' ``AttentionLayers(sandwich_norm=True)``
(tests/test_authors_packages.py). fairseq's initialisation is kept; the paper changes none.
"""

from deepnmt_plugin.models.method import DeepMethod, register_method


@register_method
class PeriLN(DeepMethod):
    name = "periln"
    layer_norm = "pre"
    branch_output_norm = True
    layernorm_embedding = True
    export_refusal = "Peri-LN's output LayerNorm on every branch is not in stock fairseq's transformer"
