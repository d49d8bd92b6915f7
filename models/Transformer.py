"""Transformer: the encoder-decoder of Vaswani et al. applied to time steps. The encoder reads the embedded
lookback window (values + positions + time features); the decoder reads the last label_len known steps
followed by zeros for the horizon, with causal self-attention and cross-attention to the encoder, and a
linear layer maps its last pred_len outputs to c_out channels. Vaswani et al., "Attention Is All You
Need", NeurIPS 2017; follows TSLib's forecasting variant (no input normalisation)."""
from torch import nn

from layers.embedding import StepTokenEmbedding
from layers.encoder import DecoderBlock, DecoderStack, EncoderBlock, EncoderStack


class Model(nn.Module):
    autoregressive = False

    def __init__(self, configs):
        super().__init__()
        self.pred_len = configs.pred_len
        mark_dim = getattr(configs, "mark_dim", 0)
        self.enc_embedding = StepTokenEmbedding(configs.enc_in, configs.d_model, mark_dim, configs.dropout)
        self.dec_embedding = StepTokenEmbedding(configs.dec_in, configs.d_model, mark_dim, configs.dropout)
        self.encoder = EncoderStack(
            [
                EncoderBlock(configs.d_model, configs.n_heads, configs.d_ff, configs.dropout, configs.activation)
                for _ in range(configs.e_layers)
            ],
            configs.d_model,
        )
        self.decoder = DecoderStack(
            [
                DecoderBlock(configs.d_model, configs.n_heads, configs.d_ff, configs.dropout, configs.activation)
                for _ in range(configs.d_layers)
            ],
            configs.d_model,
            projection=nn.Linear(configs.d_model, configs.c_out),
        )

    def forward(self, x_enc, x_mark_enc=None, x_dec=None, x_mark_dec=None):
        if x_dec is None:
            raise ValueError("Transformer needs the decoder input x_dec (label_len known steps, then zeros)")
        memory = self.encoder(self.enc_embedding(x_enc, x_mark_enc))
        out = self.decoder(self.dec_embedding(x_dec, x_mark_dec), memory)  # [B, label_len + pred_len, c_out]
        return out[:, -self.pred_len:]
