"""This release's rows of the bad-input catalogue (tests/bad_inputs.py, docs/reliability.md): each a bad input and
the one line run.py answers it with, its folder written by the release's row of tests/test_foundation.py."""

SUNDIAL = {"model_type": "sundial", "architectures": ["SundialForPrediction"]}  # thuml/sundial-base-128m's config.json


def probes(Probe, fixed, release, reader):
    """The catalogue's Probe; fixed(*argv), a probe of fixed run.py arguments; release(**damage), a probe of this
    release's folder written by its row and damaged (bad_inputs._release); reader(config), the --model of the release
    whose folder's config.json that is (another release is named through its row)."""
    return [
        Probe("TimerBase folder missing", release(lacking="folder"),
              "timer-base-84m not found; pass the folder downloaded from the Hugging Face hub (thuml/timer-base-84m: "
              "config.json and model.safetensors)", shows="`--model TimerBase --is_training 0 --pretrain_model_path` a folder that is not there"),
        Probe("TimerBase folder without its weights", release(lacking="model.safetensors"),
              "timer-base-84m is a partial Timer folder: model.safetensors missing; download both files of the "
              "release (thuml/timer-base-84m)", shows="a Timer folder holding config.json only"),
        Probe("TimerBase folder without config.json", release(lacking="config.json"),
              "timer-base-84m is a partial Timer folder: config.json missing; download both files of the release "
              "(thuml/timer-base-84m)",
              shows="a Timer folder holding model.safetensors only"),
        Probe("TimerBase weights missing a tensor", release(drop="lm_heads.0.weight"),
              "converted) does not fit model TimerBase: missing: heads.0.weight",
              shows="a Timer folder whose model.safetensors lacks lm_heads.0.weight"),
        Probe("TimerBase folder of another model",
              release(config=SUNDIAL),
              f"config.json is the config of another model (sundial / ['SundialForPrediction']; {reader(SUNDIAL)}'s "
              f"release (thuml/sundial-base-128m): --model {reader(SUNDIAL)}), not Timer's (model_type timer, "
              "thuml/timer-base-84m)",
              shows=f"`--model TimerBase --pretrain_model_path` a folder whose config.json is {reader(SUNDIAL)}'s"),
        Probe("context shorter than one Timer token", lambda f: [*release()(f), "--seq_len", 4, "--label_len", 2],
              "Timer reads whole tokens of 8 steps", shows="`--seq_len 4` from a Timer folder whose tokens are 8 steps "
              "(released: 96)"),
    ]
