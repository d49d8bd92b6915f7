"""This release's rows of the bad-input catalogue (tests/bad_inputs.py, docs/reliability.md): each a bad input and
the one line run.py answers it with, its folder written by the release's row of tests/test_foundation.py."""


def probes(Probe, fixed, release, reader):
    """The catalogue's Probe; fixed(*argv), a probe of fixed run.py arguments; release(**damage), a probe of this
    release's folder written by its row and damaged (bad_inputs._release); reader(config), the --model of the release
    whose folder's config.json that is (another release is named through its row)."""
    return [
        Probe("TiRex weights folder missing", release(lacking="folder"),
              "TiRex not found: download TiRex's release (NX-AI/TiRex: huggingface-cli download NX-AI/TiRex --local-dir "
              "DIR) and pass DIR", shows="`--model TiRex --is_training 0 --pretrain_model_path` a folder that is not there"),
        Probe("TiRex folder without model.ckpt", release(lacking="model.ckpt"),
              "TiRex has no model.ckpt, the file TiRex is released as (NX-AI/TiRex); it holds README.md",
              shows="a TiRex folder holding its README.md only"),
        Probe("TiRex model.ckpt without hyper_parameters", release(lacking="hyper_parameters"),
              "model.ckpt lacks hyper_parameters: a partial or foreign checkpoint, not TiRex's release (NX-AI/TiRex)",
              shows="a TiRex model.ckpt holding a state_dict alone"),
        Probe("TiRex model.ckpt missing a tensor", release(drop="blocks.0.slstm_layer.slstm_cell._bias_"),
              "converted) does not fit model TiRex: missing: tirex.blocks.0.slstm_layer.slstm_cell._bias_",
              shows="a TiRex model.ckpt whose state_dict lacks blocks.0.slstm_layer.slstm_cell._bias_"),
        Probe("TiRex folder of another model", release(other=True),
              "TiRex has no model.ckpt, the file TiRex is released as (NX-AI/TiRex); it holds README.md, config.json, "
              "model.safetensors (config.json + model.safetensors: another model's Hugging Face release, t5 / "
              "['ChronosBoltModelForForecasting'])",
              shows="`--model TiRex --pretrain_model_path` a folder of Chronos-Bolt's release (config.json, model.safetensors)"),
        Probe("TiRex model.ckpt of another model", release(hyper={"lr": 0.001, "hidden_size": 8}),
              "model.ckpt: its hyper_parameters (hidden_size, lr) are not a TiRex configuration (model_config with "
              "block_kwargs, input_patch_size, output_patch_size, quantiles, input_ff_dim, and train_ctx_len): a "
              "checkpoint of another model", shows="a model.ckpt whose hyper_parameters are another Lightning model's"),
        Probe("context longer than TiRex reads", release(train_ctx_len=32),
              "TiRex reads at most 32 steps of context (its train_ctx_len); --seq_len 48 would lose the oldest 16 unread",
              shows="`--seq_len 48` from a TiRex folder whose train_ctx_len is 32 (released: 2048)"),
        Probe("horizon past TiRex's window", lambda f: [*release(train_ctx_len=64)(f), "--pred_len", 96],
              "--pred_len 96 would leave its last steps no data: use --pred_len 64 or less",
              shows="`--pred_len 96` from a TiRex folder whose train_ctx_len is 64 (released: 2048)"),
    ]
