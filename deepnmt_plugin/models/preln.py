"""Pre-LN (Xiong et al. 2020, "On Layer Normalization in the Transformer Architecture").

Eq. (Pre-LN, Table 1 right): ``x_i = x_{i-1} + f_i(LN(x_{i-1}))``, plus a final LayerNorm on the
encoder and decoder outputs (fairseq builds it when ``normalize_before`` is set). The gradient at
initialisation is well behaved (Theorem 1), so the recipe trains without learning-rate warmup.
The LayerNorm moves into the branch (``layer_norm = "pre"``); the residual sum stays ``x + f``.
"""

from deepnmt_plugin.models.method import DeepMethod, register_method


@register_method
class PreLN(DeepMethod):
    name = "preln"
    layer_norm = "pre"
