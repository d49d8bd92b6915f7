"""A released model's folder given to another release's --model is named for what it is: each release's folder
signature (utils.adapters.RELEASE_SIGNATURES: TiRex's model.ckpt alone, the config.json each of the others
writes) is recognised by every release model's reader, whose one line says which --model loads it. A partial
folder of the model's own release is still called partial."""
import json

import pytest
import torch

from models.foundation.tirex import adapter as tirex
from utils import adapters, chronos2, chronos_bolt, moirai2, sundial, time_moe, timer_hf, timesfm
from utils.errors import UserError

# each release's folder as its hub repository lays it out, reduced to what tells it apart
CONFIGS = {
    "ChronosBolt": {"architectures": ["ChronosBoltModelForForecasting"], "model_type": "t5"},
    "Chronos2": {"architectures": ["Chronos2Model"], "model_type": "t5"},
    "TimesFM25": {"torch_compile": False},
    "TimerBase": {"architectures": ["TimerForPrediction"], "model_type": "timer"},
    "Sundial": {"architectures": ["SundialForPrediction"], "model_type": "sundial"},
    "TimeMoE": {"architectures": ["TimeMoeForPrediction"], "model_type": "time_moe"},
    "Moirai2": {"d_model": 384, "d_ff": 1024, "num_layers": 6, "patch_size": 16, "max_seq_len": 512,
                "num_predict_token": 4, "quantile_levels": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]},
}
RELEASES = ["TiRex", *CONFIGS]


def timer_sizes(path):
    """What TimerBase does with a folder: its config.json, then the sizes from it."""
    config, where = timer_hf.folder_config(path)
    return timer_hf.shape_from_config(config, where)


READERS = {"ChronosBolt": chronos_bolt.folder_config, "Chronos2": chronos2.read_release_config,
           "TimesFM25": timesfm.read_release, "TiRex": tirex.read_release, "TimerBase": timer_sizes,
           "Sundial": sundial.folder_config, "TimeMoE": time_moe.folder_config, "Moirai2": moirai2.folder_config}


def release_folder(root, release):
    folder = root / release
    folder.mkdir()
    if release == "TiRex":
        torch.save({"state_dict": {}, "hyper_parameters": {}}, folder / "model.ckpt")
    else:
        (folder / "config.json").write_text(json.dumps(CONFIGS[release]))
        from safetensors.torch import save_file

        save_file({"w": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


@pytest.mark.parametrize("release", RELEASES)
def test_each_release_folder_has_a_signature(tmp_path, release):
    what, model = adapters.release_of(release_folder(tmp_path, release))
    assert model == release, what


@pytest.mark.parametrize("model", RELEASES)
@pytest.mark.parametrize("release", RELEASES)
def test_another_releases_folder_is_named_with_the_model_that_reads_it(tmp_path, model, release):
    if model == release:
        pytest.skip("its own release")
    folder = release_folder(tmp_path, release)
    with pytest.raises(UserError) as refused:
        READERS[model](str(folder))
    message = str(refused.value)
    assert f"--model {release}" in message and "partial" not in message, message


def test_chronos_bolt_given_tirexs_folder_says_it_is_tirexs(tmp_path):
    folder = release_folder(tmp_path, "TiRex")
    with pytest.raises(UserError, match=r"is TiRex's release \(NX-AI/TiRex: model.ckpt, a Lightning checkpoint\), "
                                        "not a Chronos-Bolt folder: load it with --model TiRex"):
        chronos_bolt.folder_config(str(folder))


def test_a_partial_folder_of_the_models_own_release_is_still_partial(tmp_path):
    folder = release_folder(tmp_path, "ChronosBolt")
    (folder / "model.safetensors").unlink()
    with pytest.raises(UserError, match="is a partial Chronos-Bolt folder: model.safetensors missing"):
        chronos_bolt.folder_config(str(folder))
