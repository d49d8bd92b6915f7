"""This release's rows of the bad-input catalogue (tests/bad_inputs.py, docs/reliability.md): each a bad input and
the one line run.py answers it with, its folder written by the release's row of tests/test_foundation.py."""


def probes(Probe, fixed, release, reader):
    """The catalogue's Probe; fixed(*argv), a probe of fixed run.py arguments; release(**damage), a probe of this
    release's folder written by its row and damaged (bad_inputs._release); reader(config), the --model of the release
    whose folder's config.json that is (another release is named through its row)."""
    return [
        Probe("Toto 2.0 weights folder missing", release(lacking="folder"),
              "Toto-2.0-2.5B not found; pass the folder downloaded from the Hugging Face hub "
              "(Datadog/Toto-2.0-2.5B: config.json and model.safetensors",
              shows="`--model Toto2 --is_training 0 --pretrain_model_path` a folder that is not there"),
        Probe("Toto 2.0 folder without model.safetensors", release(lacking="model.safetensors"),
              "is a partial Toto 2.0 folder: model.safetensors missing; download both files of the release "
              "(Datadog/Toto-2.0-2.5B)", shows="a Toto 2.0 folder holding config.json only"),
        Probe("Toto 2.0 model.safetensors truncated", lambda f: _truncated(release()(f)),
              "model.safetensors: not a valid safetensors file", shows="a Toto 2.0 folder whose model.safetensors is "
                                                                       "cut after 5000 bytes"),
        Probe("Toto 2.0 weights missing a tensor", release(drop="transformer.layers.1.ffn.fc2.weight"),
              "converted) does not fit model Toto2: missing: toto.transformer.layers.1.ffn.fc2.weight",
              shows="a Toto 2.0 folder whose model.safetensors lacks transformer.layers.1.ffn.fc2.weight"),
        Probe("Toto 2.0 folder of another model",
              release(config={"architectures": ["ChronosBoltModelForForecasting"], "model_type": "t5"}),
              "config.json is the config of another model (model_type t5, ChronosBoltModelForForecasting), not Toto "
              "2.0's (toto2 Toto2ModelConfig", shows="`--model Toto2 --pretrain_model_path` a folder whose config.json "
                                                    "is Chronos-Bolt's"),
        Probe("context shorter than one Toto 2.0 patch", lambda f: [*release()(f), "--seq_len", 4, "--label_len", 0],
              "--seq_len 4 is shorter than one Toto 2.0 patch (8 steps)",
              shows="`--seq_len 4` from a Toto 2.0 folder of patches of 8 steps (released: 32); a context past the "
                    "rotary table (8192 patches) is tests/test_foundation.py's row"),
    ]


def _truncated(argv):
    """The probe's arguments, its folder's model.safetensors cut after 5000 bytes."""
    folder = argv[argv.index("--pretrain_model_path") + 1]
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:5000])
    return argv
