"""This release's rows of the bad-input catalogue (tests/bad_inputs.py, docs/reliability.md): each a bad input and
the one line run.py answers it with, its folder written by the release's row of tests/test_foundation.py."""


def probes(Probe, fixed, release, reader):
    """The catalogue's Probe; fixed(*argv), a probe of fixed run.py arguments; release(**damage), a probe of this
    release's folder written by its row and damaged (bad_inputs._release); reader(config), the --model of the release
    whose folder's config.json that is (another release is named through its row)."""
    return [
        Probe("TiRex-2 weights folder missing", release(lacking="folder"),
              "TiRex-2 not found: download TiRex-2's release (NX-AI/TiRex-2: huggingface-cli download NX-AI/TiRex-2 "
              "--local-dir DIR) and pass DIR",
              shows="`--model TiRex2 --is_training 0 --pretrain_model_path` a folder that is not there"),
        Probe("TiRex-2 folder without model.safetensors", release(lacking="model.safetensors"),
              "is a partial TiRex-2 folder: model.safetensors missing; download both files of the release "
              "(NX-AI/TiRex-2)", shows="a TiRex-2 folder holding its config.json only"),
        Probe("TiRex-2 model.safetensors truncated",
              release(truncate=True),
              "model.safetensors: not a valid safetensors file",
              shows="a TiRex-2 folder whose model.safetensors is cut short"),
        Probe("TiRex-2 weights missing a tensor", release(drop="stack.1.time_mixer.fwd_cell._bias_"),
              "missing: tirex2.stack.1.time_mixer.fwd_cell._bias_, tirex2.stack.1.time_mixer.rev_cell._bias_",
              shows="a TiRex-2 model.safetensors without stack.1.time_mixer.fwd_cell._bias_"),
        Probe("TiRex-2 folder of another model",
              release(config={"d_model": 64, "n_layers": 2}),
              "config.json (d_model, n_layers) is not TiRex-2's config.json (stack_config, context_len, future_len, tokenizer_cfg, ...): the folder "
              "of another model, not NX-AI/TiRex-2",
              shows="`--model TiRex2 --pretrain_model_path` a folder whose config.json is an unknown model's"),
        Probe("context longer than TiRex-2 reads", lambda f: [*release()(f), "--seq_len", 97],
              "TiRex-2 reads at most 96 steps of context (its context_len); --seq_len 97 would lose the oldest 1 unread",
              shows="`--seq_len 97` from a TiRex-2 folder whose context_len is 96 (released: 2048, presumed)"),
        Probe("horizon past TiRex-2's future_len", lambda f: [*release()(f), "--pred_len", 65],
              "TiRex-2 forecasts at most 64 steps (its future_len) in its one pass, with no roll-out; --pred_len 65 "
              "is longer", shows="`--pred_len 65` from a TiRex-2 folder whose future_len is 64 (released: 320, presumed)"),
    ]
