"""This release's rows of the bad-input catalogue (tests/bad_inputs.py, docs/reliability.md): each a bad input and
the one line run.py answers it with, its folder written by the release's row of tests/test_foundation.py."""

SUNDIAL = {"model_type": "sundial", "architectures": ["SundialForPrediction"]}  # thuml/sundial-base-128m's config.json


def probes(Probe, fixed, release, reader):
    """The catalogue's Probe; fixed(*argv), a probe of fixed run.py arguments; release(**damage), a probe of this
    release's folder written by its row and damaged (bad_inputs._release); reader(config), the --model of the release
    whose folder's config.json that is (another release is named through its row)."""
    return [
        Probe("Time-MoE folder missing", release(lacking="folder"),
              "TimeMoE-50M not found; pass the folder downloaded from the Hugging Face hub (Maple728/TimeMoE-50M or "
              "Maple728/TimeMoE-200M: config.json and model.safetensors)",
              shows="`--model TimeMoE --is_training 0 --pretrain_model_path` a folder that is not there"),
        Probe("Time-MoE folder without its weights", release(lacking="model.safetensors"),
              "TimeMoE-50M is a partial Time-MoE folder: model.safetensors missing; download both files of the release "
              "(Maple728/TimeMoE-50M or Maple728/TimeMoE-200M)", shows="a Time-MoE folder holding config.json only"),
        Probe("Time-MoE folder without config.json", release(lacking="config.json"),
              "TimeMoE-50M is a partial Time-MoE folder: config.json missing; download both files of the release "
              "(Maple728/TimeMoE-50M or Maple728/TimeMoE-200M)", shows="a Time-MoE folder holding model.safetensors only"),
        Probe("Time-MoE weights missing a tensor", release(drop="model.layers.1.ffn_layer.experts.3.up_proj.weight"),
              "converted) does not fit model TimeMoE: missing: layers.1.moe.experts.3.up.weight",
              shows="a Time-MoE folder whose model.safetensors lacks model.layers.1.ffn_layer.experts.3.up_proj.weight"),
        Probe("Time-MoE folder of another model",
              release(config=SUNDIAL),
              "config.json is the config of another model (SundialForPrediction, model_type sundial), not Time-MoE's "
              "(TimeMoeForPrediction, model_type time_moe); --model TimeMoE reads Maple728/TimeMoE-50M / "
              "Maple728/TimeMoE-200M folders", shows="`--model TimeMoE --pretrain_model_path` a folder whose config.json "
                                                     f"is {reader(SUNDIAL)}'s"),
        Probe("context and horizon past Time-MoE's positions",
              lambda f: [*release()(f), "--seq_len", 4090, "--synthetic_rows", 6000],
              "Time-MoE reads at most 4096 positions (max_position_embeddings of config.json of",
              shows="`--seq_len 4090 --pred_len 24` from a Time-MoE folder of max_position_embeddings 4096 (as released)"),
    ]
