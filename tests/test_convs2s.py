"""ConvS2S against its equations (Gehring et al. 2017, sections 3.1-3.4, as fairseq's fconv), written
out position by position, and against fairseq's initialisation. The shared model properties
(padding, causality, incremental decoding) are in test_models.py."""

from __future__ import annotations

import math

import torch

from cometnmt.config import ModelConfig, from_dict
from cometnmt.models import build_model

PAD = 0
HALF = math.sqrt(0.5)


def small(dropout: float = 0.2):
    """Widths that change between layers (residual projections) and even and odd kernel widths."""
    cfg = from_dict(ModelConfig, {"arch": "convs2s", "convs2s": {
        "embed_dim": 8, "enc_layers": [[12, 3], [16, 2]], "dec_layers": [[12, 3], [16, 4]], "out_embed_dim": 10,
        "dropout": dropout}}, "model")
    return build_model(cfg, 20, 21, PAD)


def glu_conv(layer, x: torch.Tensor, left: int) -> torch.Tensor:
    """GLU(A; B) = A * sigmoid(B) of a width-k convolution over x L,C_in whose window at t starts
    ``left`` positions before t (zeros outside the sentence): L,C_out."""
    w, b = layer.conv.conv.weight, layer.conv.conv.bias  # 2C_out,C_in,k and 2C_out
    L, k = x.size(0), w.size(2)
    out = []
    for t in range(L):
        y = b.clone()
        for j in range(k):
            s = t - left + j
            if 0 <= s < L:
                y = y + w[:, :, j] @ x[s]
        a, g = y.chunk(2)
        out.append(a * torch.sigmoid(g))
    return torch.stack(out)


def affine(lin, x: torch.Tensor) -> torch.Tensor:
    return x @ lin.weight.T + lin.bias


def test_forward_is_the_papers_equations():
    """One sentence at a time: e = w + p; encoder h' = (GLU(conv(h)) + h) sqrt(.5), centred; decoder
    causal; d_i = (W_d h_i + b_d + g_i) sqrt(.5); a_ij = softmax_j(d_i . z_j); c_i = sum_j a_ij (z_j
    + e_j) sqrt(.5) * m sqrt(1/m) (m the source length); h_i <- (W_c c_i + b_c + h_i) sqrt(.5); then
    the layer's residual, again times sqrt(.5); two linears to the vocabulary. Compared with the
    model on a padded batch."""
    torch.manual_seed(0)
    model = small().eval()
    src = torch.tensor([[5, 6, 7, 8, 9], [4, 11, 12, PAD, PAD]])
    tgt = torch.tensor([[2, 5, 6, 7], [2, 8, 9, 10]])
    with torch.no_grad():
        logits = model(src, src.eq(PAD), tgt)  # B,T,V
        for b, n in enumerate([5, 3]):
            e = model.src_embed.tokens(src[b, :n]) + model.src_embed.positions.weight[:n]  # S,E
            h = affine(model.enc_in, e)
            for layer in model.encoder:
                k = layer.conv.kernel_size
                res = h if layer.residual is None else affine(layer.residual, h)
                h = (glu_conv(layer, h, (k - 1) // 2) + res) * HALF
            z = affine(model.enc_out, h)  # S,E: keys
            values = (z + e) * HALF
            g = model.tgt_embed.tokens(tgt[b]) + model.tgt_embed.positions.weight[: tgt.size(1)]  # T,E
            h = affine(model.dec_in, g)
            for layer in model.decoder:
                k = layer.conv.kernel_size
                res = h if layer.residual is None else affine(layer.residual, h)
                c = glu_conv(layer, h, k - 1)
                d = (affine(layer.attention.to_embed, c) + g) * HALF
                a = torch.softmax(d @ z.T, dim=-1)  # T,S
                ctx = (a @ values) * (n * math.sqrt(1.0 / n))
                h = ((affine(layer.attention.to_conv, ctx) + c) * HALF + res) * HALF
            expected = affine(model.out_proj, affine(model.dec_out, h))  # T,V
            torch.testing.assert_close(logits[b], expected, atol=1e-5, rtol=1e-5)


def test_initialisation_is_fairseqs():
    """Weight-normalised layers start at their drawn weights: convolutions feeding a GLU from
    N(0, sqrt(4 (1 - p) / (k C_in))), linears after a dropout from N(0, sqrt((1 - p) / n_in)), other
    linears N(0, sqrt(1 / n_in)); embeddings N(0, 0.1) with a zero padding row; biases zero."""
    torch.manual_seed(0)
    p = 0.2
    cfg = from_dict(ModelConfig, {"arch": "convs2s", "convs2s": {
        "embed_dim": 64, "enc_layers": [[256, 3, 2]], "dec_layers": [[256, 5, 1]], "out_embed_dim": 128, "dropout": p}}, "model")
    model = build_model(cfg, 3000, 3000, PAD)

    def close(w: torch.Tensor, std: float) -> None:
        w = w.detach()
        assert abs(float(w.std()) / std - 1) < 0.05 and abs(float(w.mean())) < 0.05 * std

    close(model.encoder[0].conv.conv.weight, math.sqrt(4 * (1 - p) / (3 * 256)))
    close(model.decoder[0].conv.conv.weight, math.sqrt(4 * (1 - p) / (5 * 256)))
    close(model.enc_in.weight, math.sqrt((1 - p) / 64))
    close(model.out_proj.weight, math.sqrt((1 - p) / 128))
    close(model.enc_out.weight, math.sqrt(1 / 256))
    close(model.decoder[0].attention.to_embed.weight, math.sqrt(1 / 256))
    close(model.decoder[0].attention.to_conv.weight, math.sqrt(1 / 64))
    for emb in (model.src_embed.tokens, model.tgt_embed.positions):
        close(emb.weight[1:], 0.1)
    assert model.src_embed.tokens.weight[PAD].eq(0).all()
    assert model.encoder[0].conv.conv.bias.eq(0).all() and model.out_proj.bias.eq(0).all()
