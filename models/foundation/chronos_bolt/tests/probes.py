"""This release's rows of the bad-input catalogue (tests/bad_inputs.py, docs/reliability.md): each a bad input and
the one line run.py answers it with, its folder written by the release's row of tests/test_foundation.py."""

CHRONOS_2 = {"architectures": ["Chronos2Model"], "model_type": "t5"}  # Chronos-2's config.json, as released


def probes(Probe, fixed, release, reader):
    """The catalogue's Probe; fixed(*argv), a probe of fixed run.py arguments; release(**damage), a probe of this
    release's folder written by its row and damaged (bad_inputs._release); reader(config), the --model of the release
    whose folder's config.json that is (another release is named through its row)."""
    return [
        Probe("Chronos-Bolt folder missing", release(lacking="folder"),
              "chronos-bolt-small not found; pass the folder downloaded from the Hugging Face hub (e.g. "
              "amazon/chronos-bolt-small: config.json and model.safetensors)",
              shows="`--model ChronosBolt --is_training 0 --pretrain_model_path` a folder that is not there"),
        Probe("Chronos-Bolt folder without config.json", release(lacking="config.json"),
              "chronos-bolt-small is a partial Chronos-Bolt folder: config.json missing; download both files of the "
              "release", shows="a Chronos-Bolt folder holding model.safetensors only"),
        Probe("Chronos-Bolt folder without its weights", release(lacking="model.safetensors"),
              "chronos-bolt-small is a partial Chronos-Bolt folder: model.safetensors missing; download both files of "
              "the release", shows="a Chronos-Bolt folder holding config.json only"),
        Probe("Chronos-Bolt weights missing a tensor", release(drop="output_patch_embedding.output_layer.bias"),
              "converted) does not fit model ChronosBolt: missing: bolt.output_patch_embedding.output_layer.bias",
              shows="a Chronos-Bolt folder whose model.safetensors lacks output_patch_embedding.output_layer.bias"),
        Probe("Chronos-Bolt folder of another model",
              release(config={**CHRONOS_2, "chronos_config": {"context_length": 8192}}),
              "config.json is the config of another model (Chronos2Model, model_type t5; Chronos-2's release "
              f"(amazon/chronos-2): --model {reader(CHRONOS_2)}), not Chronos-Bolt's (ChronosBoltModelForForecasting)",
              shows="`--model ChronosBolt --pretrain_model_path` a folder whose config.json is Chronos-2's"),
        Probe("context longer than Chronos-Bolt reads", release(context_length=32),
              "--seq_len 48 is longer than the 32 steps of context Chronos-Bolt reads (chronos_config.context_length of",
              shows="`--seq_len 48` from a Chronos-Bolt folder whose chronos_config.context_length is 32 (released: 2048)"),
    ]
