"""This release's rows of the bad-input catalogue (tests/bad_inputs.py, docs/reliability.md): each a bad input and
the one line run.py answers it with, its folder written by the release's row of tests/test_foundation.py."""

SAMPLING = ("--num_samples", 2, "--sampling_steps", 1)  # a probe refuses before sampling: keep it small
TIME_MOE = {"model_type": "time_moe", "architectures": ["TimeMoeForPrediction"]}  # Time-MoE's config.json, as released


def probes(Probe, fixed, release, reader):
    """The catalogue's Probe; fixed(*argv), a probe of fixed run.py arguments; release(**damage), a probe of this
    release's folder written by its row and damaged (bad_inputs._release); reader(config), the --model of the release
    whose folder's config.json that is (another release is named through its row)."""
    return [
        Probe("Sundial folder missing", release(lacking="folder", extra=SAMPLING),
              "sundial-base-128m not found; pass the folder downloaded from the Hugging Face hub "
              "(thuml/sundial-base-128m: config.json and model.safetensors)",
              shows="`--model Sundial --is_training 0 --pretrain_model_path` a folder that is not there"),
        Probe("Sundial folder without its weights", release(lacking="model.safetensors", extra=SAMPLING),
              "sundial-base-128m is a partial Sundial folder: model.safetensors missing; download both files of the "
              "release (thuml/sundial-base-128m)", shows="a Sundial folder holding config.json only"),
        Probe("Sundial folder without config.json", release(lacking="config.json", extra=SAMPLING),
              "sundial-base-128m is a partial Sundial folder: config.json missing; download both files of the release "
              "(thuml/sundial-base-128m)", shows="a Sundial folder holding model.safetensors only"),
        Probe("Sundial weights missing a tensor", release(extra=SAMPLING, drop="flow_loss.net.final_layer.linear.weight"),
              "converted) does not fit model Sundial: missing: flow.final_layer.linear.weight",
              shows="a Sundial folder whose model.safetensors lacks flow_loss.net.final_layer.linear.weight"),
        Probe("Sundial folder of another model",
              release(extra=SAMPLING, config=TIME_MOE),
              "config.json is the config of another model (TimeMoeForPrediction, model_type time_moe; a Time-MoE release "
              f"(Maple728/{reader(TIME_MOE)}-50M / -200M): --model {reader(TIME_MOE)}), not Sundial's "
              "(SundialForPrediction, model_type sundial)",
              shows="`--model Sundial --pretrain_model_path` a folder whose config.json is Time-MoE's"),
        Probe("context shorter than one Sundial token", lambda f: [*release(extra=SAMPLING)(f), "--seq_len", 3, "--label_len", 2],
              "Sundial reads tokens of 4 steps and --seq_len 3 is shorter than one",
              shows="`--seq_len 3` from a Sundial folder whose tokens are 4 steps (released: 16)"),
    ]
