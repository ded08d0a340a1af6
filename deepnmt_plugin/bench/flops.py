"""Model FLOPs of one training update of an encoder-decoder Transformer, from a batch's real shapes.

The accounting of Kaplan et al. 2020 ("Scaling Laws for Neural Language Models", section 2.1) and Narayanan et
al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"), the one behind
"6 x parameters x tokens": a multiply-add is 2 FLOPs, and the backward costs twice the forward (the gradients of a
matmul's input and of its weight), so an update is 3 x the forward's FLOPs (Narayanan et al.'s 96·B·s·l·h² is 4 x
for the layers: it adds recomputing the activations, which fairseq does only with --checkpoint-activations). With B
sentences, S source and T target positions (padding included: it is computed), N encoder and M decoder layers,
width d, FFN width f and vocabulary V, the forward's multiply-adds are

- per encoder layer: 4·d·d (q, k, v, out) + 2·d·f (FFN) per source token, and 2·S·S·d per sentence (QKᵀ, AV);
- per decoder layer: 4·d·d (self-attention) + 2·d·d (cross-attention's q, out) + 2·d·f per target token,
  2·d·d (cross-attention's k, v) per source token, and 2·T·T·d + 2·T·S·d per sentence (self-attention as
  computed, the full T x T without a causal saving, and cross-attention);
- d·V per target token for the output projection (the embedding lookup is a gather: 0 FLOPs).

Only the model's matmuls are counted, as model FLOPs utilisation (MFU, named by PaLM, Chowdhery et al. 2022)
conventionally does: LayerNorms, softmax, residual scalings, DLCL's and DenseFormer's layer combinations and
Hyper-Connections' stream mixing are elementwise or tiny matmuls and are left out, so every arch of the same shape
has the same count.
"""


def forward_flops(encoder_layers: int, decoder_layers: int, embed_dim: int, ffn_dim: int, vocab: int, batch) -> int:
    """FLOPs of the forward pass on ``batch``, a fairseq translation batch."""
    sentences, source = batch["net_input"]["src_tokens"].shape
    target = batch["target"].shape[1]
    d, f = embed_dim, ffn_dim
    encoder = sentences * source * (4 * d * d + 2 * d * f) + sentences * 2 * source * source * d
    decoder = (sentences * target * (6 * d * d + 2 * d * f) + sentences * source * 2 * d * d
               + sentences * (2 * target * target * d + 2 * target * source * d))
    output = sentences * target * d * vocab
    return 2 * (encoder_layers * encoder + decoder_layers * decoder + output)


def update_flops(encoder_layers: int, decoder_layers: int, embed_dim: int, ffn_dim: int, vocab: int, batch) -> int:
    """FLOPs of one training update (forward and backward) on ``batch``."""
    return 3 * forward_flops(encoder_layers, decoder_layers, embed_dim, ffn_dim, vocab, batch)
