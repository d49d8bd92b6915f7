"""The fixed sinusoidal positions of the Transformer (Vaswani et al. 2017), below both of their users: the
embeddings of layers/ add them, and OpenLTM's Timer files carry them (utils.openltm writes and checks them)."""
import math

import torch


def sinusoid_table(rows: int, d_model: int) -> torch.Tensor:
    """[rows, d_model]: row i holds sin / cos of i at geometrically spaced frequencies (Vaswani et al. 2017),
    the positions of every Transformer here and the fixed calendar tables of TSLib's FixedEmbedding."""
    position = torch.arange(rows, dtype=torch.float32).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * -(math.log(10000.0) / d_model))
    table = torch.zeros(rows, d_model)
    table[:, 0::2] = torch.sin(position * div_term)
    table[:, 1::2] = torch.cos(position * div_term[: d_model // 2])
    return table
