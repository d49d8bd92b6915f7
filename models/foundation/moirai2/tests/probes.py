"""This release's rows of the bad-input catalogue (tests/bad_inputs.py, docs/reliability.md): each a bad input and
the one line run.py answers it with, its folder written by the release's row of tests/test_foundation.py."""


def probes(Probe, fixed, release, reader):
    """The catalogue's Probe; fixed(*argv), a probe of fixed run.py arguments; release(**damage), a probe of this
    release's folder written by its row and damaged (bad_inputs._release); reader(config), the --model of the release
    whose folder's config.json that is (another release is named through its row)."""
    return [
        Probe("Moirai 2.0 weights folder missing", release(lacking="folder"),
              "moirai-2.0-R-small not found; pass the folder downloaded from the Hugging Face hub "
              "(Salesforce/moirai-2.0-R-small: config.json and model.safetensors",
              shows="`--model Moirai2 --is_training 0 --pretrain_model_path` a folder that is not there"),
        Probe("Moirai 2.0 folder without model.safetensors", release(lacking="model.safetensors"),
              "is a partial Moirai 2.0 folder: model.safetensors missing; download both files of the release "
              "(Salesforce/moirai-2.0-R-small)", shows="a Moirai 2.0 folder holding config.json only"),
        Probe("Moirai 2.0 weights missing a tensor", release(drop="encoder.layers.1.ffn.fc_gate.weight"),
              "converted) does not fit model Moirai2: missing: moirai.encoder.layers.1.ffn.fc_gate.weight",
              shows="a Moirai 2.0 folder whose model.safetensors lacks encoder.layers.1.ffn.fc_gate.weight"),
        Probe("Moirai 2.0 folder of another model",
              release(config={"architectures": ["ChronosBoltModelForForecasting"], "model_type": "t5"}),
              "config.json is the config of another model (model_type t5, ChronosBoltModelForForecasting), not Moirai "
              "2.0's (uni2ts Moirai2Module", shows="`--model Moirai2 --pretrain_model_path` a folder whose config.json "
                                                  "is Chronos-Bolt's"),
        Probe("Moirai 1.x folder given to Moirai 2.0",
              release(config={"d_model": 384, "num_layers": 6, "patch_sizes": [8, 16, 32, 64, 128],
                                      "max_seq_len": 512, "distr_output": {}}),
              "config.json is the config of Moirai 1.x or Moirai-MoE (patch_sizes / distr_output: a masked encoder "
              "with a mixture distribution), not Moirai 2.0's", shows="a folder whose config.json is Moirai 1.1-R-small's"),
        Probe("context and horizon past Moirai 2.0's tokens", lambda f: [*release()(f), "--seq_len", 240],
              "Moirai 2.0 reads at most 64 tokens of 4 steps (max_seq_len): --seq_len 240 + --pred_len 24 make 66",
              shows="`--seq_len 240 --pred_len 24` from a Moirai 2.0 folder of max_seq_len 64 tokens of 4 steps "
                    "(released: 512 of 16)"),
    ]
