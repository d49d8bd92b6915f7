"""This release's rows of the bad-input catalogue (tests/bad_inputs.py, docs/reliability.md): each a bad input and
the one line run.py answers it with, its folder written by the release's row of tests/test_foundation.py."""


def probes(Probe, fixed, release, reader):
    """The catalogue's Probe; fixed(*argv), a probe of fixed run.py arguments; release(**damage), a probe of this
    release's folder written by its row and damaged (bad_inputs._release); reader(config), the --model of the release
    whose folder's config.json that is (another release is named through its row)."""
    return [
        Probe("Chronos-2 weights folder missing", release(lacking="folder", path_name="absent"),
              "absent not found: download amazon/chronos-2 (config.json and model.safetensors) and pass its folder",
              shows="`--model Chronos2 --is_training 0 --pretrain_model_path` a folder that is not there"),
        Probe("Chronos-2 folder without its weights", release(lacking="model.safetensors"),
              "chronos-2 has no model.safetensors: the folder of amazon/chronos-2 holds config.json and model.safetensors; "
              "download both", shows="a Chronos-2 folder holding config.json only"),
        Probe("Chronos-2 folder without config.json", release(lacking="config.json"),
              "chronos-2 has no config.json: the folder of amazon/chronos-2 holds config.json and model.safetensors",
              shows="a Chronos-2 folder holding model.safetensors only"),
        Probe("Chronos-2 weights missing a tensor", release(drop="encoder.block.0.layer.1.self_attention.q.weight"),
              "does not fit model Chronos2: missing: chronos.encoder.block.0.layer.1.self_attention.q.weight",
              shows="a Chronos-2 folder whose model.safetensors lacks one tensor"),
        Probe("Chronos-2 folder of another model", release(config={
                  "architectures": ["ChronosBoltModelForForecasting"], "model_type": "t5", "chronos_config": {}}),
              "config.json is the config of another model (architectures ['ChronosBoltModelForForecasting'], model_type "
              "t5), not Chronos-2's (architectures ['Chronos2Model'], amazon/chronos-2)",
              shows="`--model Chronos2 --pretrain_model_path` a folder whose config.json is Chronos-Bolt's"),
        Probe("Chronos-2 context shorter than --seq_len", release(context_length=32, time_encoding_scale=32),
              "--seq_len 48 is longer than Chronos-2's context of 32 steps (config.json chronos_config.context_length)",
              shows="`--seq_len 48` with a Chronos-2 folder whose context_length is 32"),
        Probe("Chronos-2 quantiles of another model", release(quantiles=[0.1, 0.5, 0.9]),
              "its config.json forecasts the quantiles [0.1, 0.5, 0.9], not the 21 of amazon/chronos-2",
              shows="a Chronos-2 folder whose chronos_config.quantiles are 0.1, 0.5, 0.9"),
    ]
