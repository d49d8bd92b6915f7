"""This release's rows of the bad-input catalogue (tests/bad_inputs.py, docs/reliability.md): each a bad input and
the one line run.py answers it with, its folder written by the release's row of tests/test_foundation.py."""


def probes(Probe, fixed, release, reader):
    """The catalogue's Probe; fixed(*argv), a probe of fixed run.py arguments; release(**damage), a probe of this
    release's folder written by its row and damaged (bad_inputs._release); reader(config), the --model of the release
    whose folder's config.json that is (another release is named through its row)."""
    return [
        Probe("TimesFM 2.5 weights folder missing", release(lacking="folder"),
              "timesfm-2.5-200m-pytorch not found: download google/timesfm-2.5-200m-pytorch (config.json and "
              "model.safetensors) and pass its folder", shows="`--model TimesFM25 --is_training 0 --pretrain_model_path` "
              "a folder that is not there"),
        Probe("TimesFM 2.5 folder without its weights", release(config={"torch_compile": False}),
              "timesfm-2.5-200m-pytorch lacks model.safetensors: download the whole folder of google/timesfm-2.5-200m-pytorch",
              shows="a TimesFM 2.5 folder holding config.json only"),
        Probe("TimesFM 2.5 weights missing tensors",
              release(config={"torch_compile": False}, tensors={"tokenizer.hidden_layer.weight": (8, 64)}),
              "model.safetensors lacks tokenizer.output_layer.weight, stacked_xf.0.attn.query_ln.scale, "
              "stacked_xf.0.ff0.weight, output_projection_point.hidden_layer.weight, ... (7 in all): not a complete "
              "TimesFM 2.5 checkpoint", shows="a TimesFM 2.5 folder whose model.safetensors holds one tensor"),
        Probe("TimesFM 2.5 folder of another model",
              release(config={"architectures": ["T5ForConditionalGeneration"], "model_type": "t5"},
                                tensors={"shared.weight": (4, 8)}),
              "config.json is the config.json of t5 / T5ForConditionalGeneration, not of TimesFM 2.5: TimesFM25 reads "
              "google/timesfm-2.5-200m-pytorch's folder", shows="`--model TimesFM25 --pretrain_model_path` a folder "
              "whose config.json is a T5's (Chronos)"),
        Probe("TimesFM 2.5 horizon past its quantile head",
              fixed("--model", "TimesFM25", "--synthetic_rows", 20000, "--seq_len", 48, "--label_len", 24, "--pred_len", 1100),
              "TimesFM 2.5's quantile head forecasts at most 1024 steps; pred_len 1100 is longer"),
    ]
