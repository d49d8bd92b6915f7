"""TSLib's layer surface (layers/tslib/: Embed.py, SelfAttention_Family.py, Transformer_EncDec.py, StandardNorm.py,
Conv_Blocks.py, utils/masking.py) without a TSLib checkout: the modules and classes TSLib's long-term
forecasting model files import, with TSLib's constructor and forward signatures and state_dict key names
(a TSLib checkpoint loads); a few values known exactly; and attention dropout keyed by the sample, so a
TSLib-style encoder built from these layers trains alike on 1 and 2 processes.
lab/tslib_layers.py --tslib PATH compares every class with TSLib's own code, forward and gradients.
"""
import importlib
import importlib.util
import inspect
import math
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest
import torch
from torch import nn

from helpers import run_on_ranks
from utils.errors import UserError

REPO = Path(__file__).resolve().parent.parent

# module -> {class: (constructor parameters, forward parameters)}, as TSLib (4e938a1) spells them
SURFACE = {
    "layers.Embed": {
        "PositionalEmbedding": ("d_model, max_len=5000", "x"),
        "TokenEmbedding": ("c_in, d_model", "x"),
        "FixedEmbedding": ("c_in, d_model", "x"),
        "TemporalEmbedding": ("d_model, embed_type='fixed', freq='h'", "x"),
        "TimeFeatureEmbedding": ("d_model, embed_type='timeF', freq='h'", "x"),
        "DataEmbedding": ("c_in, d_model, embed_type='fixed', freq='h', dropout=0.1", "x, x_mark"),
        "DataEmbedding_inverted": ("c_in, d_model, embed_type='fixed', freq='h', dropout=0.1", "x, x_mark"),
        "DataEmbedding_wo_pos": ("c_in, d_model, embed_type='fixed', freq='h', dropout=0.1", "x, x_mark"),
        "PatchEmbedding": ("d_model, patch_len, stride, padding, dropout", "x"),
    },
    "layers.SelfAttention_Family": {
        **{name: ("mask_flag=True, factor=5, scale=None, attention_dropout=0.1, output_attention=False",
                  "queries, keys, values, attn_mask, tau=None, delta=None")
           for name in ("FullAttention", "ProbAttention", "DSAttention")},
        "AttentionLayer": ("attention, d_model, n_heads, d_keys=None, d_values=None",
                           "queries, keys, values, attn_mask, tau=None, delta=None"),
        "ReformerLayer": ("attention, d_model, n_heads, d_keys=None, d_values=None, causal=False, bucket_size=4, "
                          "n_hashes=4", "queries, keys, values, attn_mask, tau, delta"),
        "TwoStageAttentionLayer": ("configs, seg_num, factor, d_model, n_heads, d_ff=None, dropout=0.1",
                                   "x, attn_mask=None, tau=None, delta=None"),
    },
    "layers.Transformer_EncDec": {
        "ConvLayer": ("c_in", "x"),
        "EncoderLayer": ("attention, d_model, d_ff=None, dropout=0.1, activation='relu'",
                         "x, attn_mask=None, tau=None, delta=None"),
        "Encoder": ("attn_layers, conv_layers=None, norm_layer=None", "x, attn_mask=None, tau=None, delta=None"),
        "DecoderLayer": ("self_attention, cross_attention, d_model, d_ff=None, dropout=0.1, activation='relu'",
                         "x, cross, x_mask=None, cross_mask=None, tau=None, delta=None"),
        "Decoder": ("layers, norm_layer=None, projection=None",
                    "x, cross, x_mask=None, cross_mask=None, tau=None, delta=None"),
    },
    "layers.StandardNorm": {
        "Normalize": ("num_features, eps=1e-05, affine=False, subtract_last=False, non_norm=False", "x, mode"),
    },
    "layers.Conv_Blocks": {
        name: ("in_channels, out_channels, num_kernels=6, init_weight=True", "x")
        for name in ("Inception_Block_V1", "Inception_Block_V2")
    },
}


def _parameters(function):
    """"a, b=1": names and defaults, annotations left out."""
    return ", ".join(str(p.replace(annotation=inspect.Parameter.empty))
                     for name, p in inspect.signature(function).parameters.items() if name != "self")


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_surface_has_tslibs_classes_and_signatures(module):
    loaded = importlib.import_module(module)
    for name, (init, forward) in SURFACE[module].items():
        cls = getattr(loaded, name)
        assert _parameters(cls.__init__) == init, f"{module}.{name}"
        # forward: TSLib's parameters first; ours may add optional ones (InceptionBlock's merged kernel)
        ours = _parameters(cls.forward)
        assert ours == forward or ours.startswith(forward + ", ") and "=" in ours[len(forward):], f"{module}.{name}"


def test_masking_has_tslibs_masks():
    from utils.masking import ProbMask, TriangularCausalMask

    assert _parameters(TriangularCausalMask.__init__) == "B, L, device='cpu'"
    assert _parameters(ProbMask.__init__) == "B, H, L, index, scores, device='cpu'"
    assert TriangularCausalMask(1, 3).mask[0, 0].tolist() == [[False, True, True], [False, False, True],
                                                              [False, False, False]]
    index = torch.tensor([[[2, 0]]])
    assert ProbMask(1, 1, 3, index, torch.zeros(1, 1, 2, 3)).mask[0, 0].tolist() == [[False] * 3, [False, True, True]]


def _attention_layer(mask_flag=False, inner="FullAttention", d_model=8, n_heads=2, dropout=0.0):
    from layers import SelfAttention_Family as A

    return A.AttentionLayer(getattr(A, inner)(mask_flag, 5, None, dropout, False), d_model, n_heads)


def test_state_dict_keys_are_tslibs():
    from layers.Conv_Blocks import Inception_Block_V1
    from layers.Embed import DataEmbedding, PatchEmbedding
    from layers.StandardNorm import Normalize
    from layers.Transformer_EncDec import DecoderLayer, EncoderLayer

    projections = [f"{p}_projection.{w}" for p in ("query", "key", "value", "out") for w in ("weight", "bias")]
    ffn = ["conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"]
    expected = {
        DataEmbedding(3, 8, "timeF", "h"): ["value_embedding.tokenConv.weight", "position_embedding.pe",
                                            "temporal_embedding.embed.weight"],
        DataEmbedding(3, 8, "fixed", "t"): ["value_embedding.tokenConv.weight", "position_embedding.pe"] + [
            f"temporal_embedding.{f}_embed.emb.weight" for f in ("minute", "hour", "weekday", "day", "month")],
        PatchEmbedding(8, 4, 2, 2, 0.1): ["value_embedding.weight", "position_embedding.pe"],
        EncoderLayer(_attention_layer(), 8): [f"attention.{k}" for k in projections] + ffn + [
            f"norm{i}.{w}" for i in (1, 2) for w in ("weight", "bias")],
        DecoderLayer(_attention_layer(True), _attention_layer(), 8): [
            f"{a}_attention.{k}" for a in ("self", "cross") for k in projections] + ffn + [
            f"norm{i}.{w}" for i in (1, 2, 3) for w in ("weight", "bias")],
        Normalize(3, affine=True): ["affine_weight", "affine_bias"],
        Inception_Block_V1(2, 3, 2): ["kernels.0.weight", "kernels.0.bias", "kernels.1.weight", "kernels.1.bias"],
    }
    for layer, keys in expected.items():
        assert sorted(layer.state_dict()) == sorted(keys), type(layer).__name__
    assert EncoderLayer(_attention_layer(), 8, 16).conv1.weight.shape == (16, 8, 1)  # a Conv1d, as TSLib's


def test_positions_and_fixed_tables_are_the_sinusoids():
    from layers.Embed import FixedEmbedding, PositionalEmbedding

    pe = PositionalEmbedding(4).pe[0]
    assert pe[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    torch.testing.assert_close(pe[3], torch.tensor([math.sin(3), math.cos(3), math.sin(3 / 100), math.cos(3 / 100)]))
    table = FixedEmbedding(24, 4)
    assert not table.emb.weight.requires_grad
    torch.testing.assert_close(table(torch.tensor([3])), pe[3:4])


def test_undated_data_has_no_calendar_term():
    from layers.Embed import DataEmbedding

    embed = DataEmbedding(3, 8, "timeF", "h", 0.0)
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(embed(x, torch.zeros(2, 5, 0)), embed(x, None))


def test_attention_known_values():
    """Equal keys: every query averages the values; causal: the first step sees only itself; DSAttention
    with tau 1 and delta 0 is FullAttention; ProbAttention choosing every query is FullAttention."""
    from layers.SelfAttention_Family import DSAttention, FullAttention, ProbAttention

    q, v = torch.randn(2, 6, 2, 4), torch.randn(2, 6, 2, 4)
    out, _ = FullAttention(False, attention_dropout=0.0)(q, torch.ones(2, 6, 2, 4), v, None)
    torch.testing.assert_close(out, v.mean(1, keepdim=True).expand_as(v))
    k = torch.randn(2, 6, 2, 4)
    causal, weights = FullAttention(True, attention_dropout=0.0, output_attention=True)(q, k, v, None)
    torch.testing.assert_close(causal[:, 0], v[:, 0])
    assert weights.triu(1).abs().max() == 0
    torch.testing.assert_close(FullAttention(True, attention_dropout=0.0)(q, k, v, None)[0], causal)
    torch.testing.assert_close(DSAttention(True, attention_dropout=0.0)(q, k, v, None)[0], causal)
    full, _ = FullAttention(False, attention_dropout=0.0)(q, k, v, None)
    prob = ProbAttention(False, factor=6).eval()(q, k, v, None)[0]
    torch.testing.assert_close(prob, full.transpose(1, 2))  # [B, H, L, D], as TSLib's (AttentionLayer views it so)


def test_prob_attention_is_fixed_in_eval_and_random_in_training():
    from layers.SelfAttention_Family import ProbAttention

    q, k, v = (torch.randn(2, 48, 2, 4) for _ in range(3))
    layer = ProbAttention(True, factor=1).eval()
    first = layer(q, k, v, None)[0]
    torch.testing.assert_close(layer(q, k, v, None)[0], first, rtol=0, atol=0)
    layer.train()
    assert any(not torch.equal(layer(q, k, v, None)[0], first) for _ in range(5))


def test_normalize_round_trip_and_inception_is_the_mean_of_its_convolutions():
    from layers.Conv_Blocks import Inception_Block_V1, Inception_Block_V2
    from layers.StandardNorm import Normalize

    x = torch.randn(3, 20, 4) * 5 + 2
    norm = Normalize(4, affine=True, subtract_last=True)
    normed = norm(x, "norm")
    torch.testing.assert_close(normed[:, -1], torch.zeros(3, 4))
    torch.testing.assert_close(norm(normed, "denorm"), x)
    grid = torch.randn(2, 3, 5, 7)
    for block in (Inception_Block_V1(3, 4, 3), Inception_Block_V2(3, 4, 4)):
        separate = torch.stack([conv(grid) for conv in block.kernels]).mean(0)
        torch.testing.assert_close(block(grid), separate, rtol=1e-5, atol=1e-5)


def test_reformer_layer_is_refused_in_one_line_without_its_package():
    pytest.importorskip("torch")
    if importlib.util.find_spec("reformer_pytorch") is not None:
        pytest.skip("reformer_pytorch is installed")
    from layers.SelfAttention_Family import ReformerLayer

    with pytest.raises(UserError, match=r"pip install reformer-pytorch") as refused:
        ReformerLayer(None, 8, 2)
    assert "\n" not in str(refused.value)


# ------------------------------------------------------------------ 1 and 2 processes train alike

BATCH, STEPS = 8, 3


def _tslib_encoder(inner):
    """A TSLib-style encoder (iTransformer's / Informer's) from the surface, dropout 0.3 everywhere."""
    from layers.Embed import DataEmbedding
    from layers.Transformer_EncDec import Encoder, EncoderLayer

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = DataEmbedding(3, 16, "timeF", "h", 0.3)
            self.encoder = Encoder([EncoderLayer(_attention_layer(inner == "ProbAttention", inner, 16, 2, 0.3), 16,
                                                 32, 0.3, "gelu") for _ in range(2)], norm_layer=nn.LayerNorm(16))
            self.head = nn.Linear(16, 3)

        def forward(self, x, x_mark):
            return self.head(self.encoder(self.embedding(x, x_mark))[0])

    return Model()


def train_both(rank, world_size, micro_batches=1):
    return {inner: train_keyed(rank, world_size, inner, micro_batches) for inner in ("FullAttention", "ProbAttention")}


def train_keyed(rank, world_size, inner, micro_batches=1):
    """STEPS SGD steps on a global batch of BATCH windows split over the ranks, each rank's share run as
    `micro_batches` accumulated micro-batches, masks keyed by the sample; the final weights."""
    import torch.distributed as dist

    from layers.dropout import KeyedDropout, masks_follow_samples

    torch.manual_seed(0)
    model = KeyedDropout.convert(_tslib_encoder(inner)).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.Generator().manual_seed(1)
    share = BATCH // world_size
    for step in range(STEPS):
        x, marks, y = torch.randn(BATCH, 24, 3, generator=data), torch.randn(BATCH, 24, 4, generator=data), \
            torch.randn(BATCH, 24, 3, generator=data)
        optimizer.zero_grad()
        micro = share // micro_batches
        for first in range(rank * share, (rank + 1) * share, micro):
            mine = slice(first, first + micro)
            with masks_follow_samples(step, first, micro):
                loss = (model(x[mine], marks[mine]) - y[mine]).square().mean() * micro / BATCH
            loss.backward()
        if world_size > 1:
            for p in model.parameters():
                dist.all_reduce(p.grad)
        optimizer.step()
    return {name: p.detach().numpy().copy() for name, p in model.state_dict().items()}  # by value, not shared


def test_tslib_style_encoder_trains_alike_on_1_and_2_processes():
    """1 x 8, 2 x 4 and 1 x (2 micro-batches of 4): the same weights (the dropout masks and ProbAttention's
    key samples follow the sample)."""
    single, pair = (run_on_ranks(train_both, n)[0] for n in (1, 2))
    accumulated = run_on_ranks(train_both, 1, 2)[0]
    for inner in single:
        _same_training(inner, single[inner], pair[inner])
        _same_training(inner, single[inner], accumulated[inner])


def _same_training(inner, single, pair):
    torch.manual_seed(0)
    initial = _tslib_encoder(inner).state_dict()
    assert (torch.from_numpy(single["head.weight"]) - initial["head.weight"]).abs().max() > 1e-3  # it trained
    for name, weight in single.items():
        torch.testing.assert_close(torch.from_numpy(pair[name]), torch.from_numpy(weight), rtol=1e-6, atol=1e-7,
                                   msg=f"{inner}: {name}")


def test_tslibs_module_names_import_the_modules_of_layers_tslib():
    """`from layers.Embed import DataEmbedding`, as a TSLib model file writes it, gives layers.tslib.Embed's class:
    one module under two names, whichever is imported first, so isinstance holds across them."""
    import layers
    from layers.tslib import Embed
    assert sorted(layers.TSLIB_MODULES) == sorted(p.stem for p in (REPO / "layers" / "tslib").glob("[A-Z]*.py"))
    assert importlib.import_module("layers.Embed") is Embed
    assert importlib.import_module("layers.Embed").__spec__.name == "layers.tslib.Embed"
    from layers.Embed import DataEmbedding
    assert isinstance(DataEmbedding(3, 8), Embed.DataEmbedding)
    tslib_first = ("from layers.Transformer_EncDec import Encoder; import layers.tslib.Transformer_EncDec as t; "
                   "import layers.Transformer_EncDec as u; import sys; assert Encoder is t.Encoder and t is u; "
                   "assert 'layers.Transformer_EncDec' in sys.modules; print('ok')")
    done = subprocess.run([sys.executable, "-c", tslib_first], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.strip() == "ok", done.stderr


def test_a_dropped_in_tslib_style_file_imports_by_tslibs_names(tmp_path):
    """A model file written as TSLib writes them, its imports unchanged, builds and runs on these layers."""
    (tmp_path / "DroppedIn.py").write_text(
        "from torch import nn\n"
        "from layers.Embed import DataEmbedding\n"
        "from layers.SelfAttention_Family import AttentionLayer, FullAttention\n"
        "from layers.StandardNorm import Normalize\n"
        "from layers.Transformer_EncDec import Encoder, EncoderLayer\n\n\n"
        "class Model(nn.Module):\n"
        "    def __init__(self, c_in=3, d_model=8):\n"
        "        super().__init__()\n"
        "        self.norm = Normalize(c_in)\n"
        "        self.embedding = DataEmbedding(c_in, d_model, 'timeF', 'h', 0.0)\n"
        "        self.encoder = Encoder([EncoderLayer(AttentionLayer(FullAttention(False, attention_dropout=0.0),\n"
        "                                                             d_model, 2), d_model, 16, dropout=0.0)])\n\n"
        "    def forward(self, x, x_mark):\n"
        "        return self.encoder(self.embedding(self.norm(x, 'norm'), x_mark))[0]\n")
    spec = importlib.util.spec_from_file_location("DroppedIn", tmp_path / "DroppedIn.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from layers.tslib.Transformer_EncDec import Encoder
    model = module.Model()
    assert isinstance(model.encoder, Encoder)
    assert model(torch.randn(2, 12, 3), torch.randn(2, 12, 4)).shape == (2, 12, 8)


def test_a_tslib_checkouts_own_layers_package_is_left_alone(tmp_path):
    """With a TSLib checkout's `layers` imported in place of ours (benchmarks.checkouts.packages_from), its names
    are its own files: the alias answers under this repository's package only."""
    (tmp_path / "layers").mkdir()
    (tmp_path / "layers" / "__init__.py").write_text("")
    (tmp_path / "layers" / "Embed.py").write_text("THEIRS = True\n")
    swap = (f"import sys; import layers.Embed; "
            f"[sys.modules.pop(n) for n in list(sys.modules) if n.split('.')[0] == 'layers']; "
            f"sys.path.insert(0, {str(tmp_path)!r}); import layers.Embed as e; assert e.THEIRS\n"
            f"try:\n    import layers.Conv_Blocks\nexcept ImportError as e:\n    print(e.name)")
    done = subprocess.run([sys.executable, "-c", swap], cwd=REPO, capture_output=True, text=True)
    assert done.stdout.strip() == "layers.Conv_Blocks", done.stdout + done.stderr  # theirs lacks it: not ours
