"""OpenLTM's checkpoints in and out: the key table between thuml/OpenLTM's Timer-XL and Timer
(models/timer_xl.py, models/timer.py and its layers/) and ours (models/TimerXL.py, models/Timer.py), the
conversions both ways, and the two adapters (utils/adapters.py) that our models declare to read OpenLTM's
files: `checkpoint_adapters = (openltm.TIMER_XL,)` in models/TimerXL.py, `(openltm.TIMER,)` in
models/Timer.py. LACKING names thuml's other models, for refusals.

Written from OpenLTM's public model code (commit 0b30050, 2026-03-22; the layout has been the same
since 2024-11-04, when `encoder` became `blocks`). Nothing here imports OpenLTM.

The table, per model (`{n}`: a layer index, `{p}`: weight or bias):

| ours | OpenLTM | shape |
|---|---|---|
| `embedding.{p}` | `embedding.{p}` | same (Timer: weight only, no bias in either) |
| TimerXL `blocks.layers.{n}.attention.{q,k,v,out}_projection.{p}` | `blocks.attn_layers.{n}.attention.{q,k,v,out}_projection.{p}` | same |
| Timer `blocks.layers.{n}.attention.causal.{query,key,value,out}.{p}` | `blocks.attn_layers.{n}.attention.{query,key,value,out}_projection.{p}` | same |
| TimerXL `blocks.layers.{n}.attention.variable_bias.emb.weight` | `blocks.attn_layers.{n}.attention.inner_attention.attn_bias.emb.weight` | same, [2, n_heads] |
| `blocks.layers.{n}.linear1.weight` | `blocks.attn_layers.{n}.conv1.weight` | ours [d_ff, d_model], OpenLTM [d_ff, d_model, 1] |
| `blocks.layers.{n}.linear2.weight` | `blocks.attn_layers.{n}.conv2.weight` | ours [d_model, d_ff], OpenLTM [d_model, d_ff, 1] |
| `blocks.layers.{n}.linear{1,2}.bias` | `blocks.attn_layers.{n}.conv{1,2}.bias` | same |
| `blocks.layers.{n}.norm{1,2}.{p}` | `blocks.attn_layers.{n}.norm{1,2}.{p}` | same |
| `blocks.norm.{p}`, `head.{p}` | `blocks.norm.{p}`, `head.{p}` | same |
| (Timer: recomputed, not saved) | `position_embedding.pe` | OpenLTM's persistent sinusoid buffer [1, 6500, d_model]: checked and dropped on the way in, made on the way out |

OpenLTM's query/key projection module (`inner_attention.qk_proj`, a QueryKeyProjection around a
RotaryProjection) holds only non-persistent buffers (theta, cos, sin), so it has no keys: our
RotaryEmbedding recomputes the same rotation. With more than one variable OpenLTM's Timer-XL
computes another function than the paper (see layers/attention.TimeAttention, kind="openltm").
"""
import re
from dataclasses import dataclass

import torch

from utils.adapters import CheckpointAdapter, Lacking, any_key
from utils.errors import UserError
from utils.positions import sinusoid_table


@dataclass(frozen=True)
class Rule:
    """One row of the table: our key pattern, OpenLTM's, and whether the weight is a kernel-size-1
    Conv1d there ([out, in, 1]) and a Linear here ([out, in])."""
    ours: str
    openltm: str
    conv1x1: bool = False


def _layer_rules():
    """Feed-forward, norms and head: spelled alike by both models of both codebases."""
    return (
        Rule("blocks.layers.{n}.linear1.weight", "blocks.attn_layers.{n}.conv1.weight", conv1x1=True),
        Rule("blocks.layers.{n}.linear1.bias", "blocks.attn_layers.{n}.conv1.bias"),
        Rule("blocks.layers.{n}.linear2.weight", "blocks.attn_layers.{n}.conv2.weight", conv1x1=True),
        Rule("blocks.layers.{n}.linear2.bias", "blocks.attn_layers.{n}.conv2.bias"),
        Rule("blocks.layers.{n}.norm1.{p}", "blocks.attn_layers.{n}.norm1.{p}"),
        Rule("blocks.layers.{n}.norm2.{p}", "blocks.attn_layers.{n}.norm2.{p}"),
        Rule("blocks.norm.{p}", "blocks.norm.{p}"),
        Rule("head.{p}", "head.{p}"),
    )


KEY_TABLE = {
    "TimerXL": (
        Rule("embedding.{p}", "embedding.{p}"),
        *(Rule(f"blocks.layers.{{n}}.attention.{name}_projection.{{p}}",
               f"blocks.attn_layers.{{n}}.attention.{name}_projection.{{p}}")
          for name in ("query", "key", "value", "out")),
        Rule("blocks.layers.{n}.attention.variable_bias.emb.weight",
             "blocks.attn_layers.{n}.attention.inner_attention.attn_bias.emb.weight"),
        *_layer_rules(),
    ),
    "Timer": (
        Rule("embedding.weight", "embedding.weight"),
        *(Rule(f"blocks.layers.{{n}}.attention.causal.{name}.{{p}}",
               f"blocks.attn_layers.{{n}}.attention.{name}_projection.{{p}}")
          for name in ("query", "key", "value", "out")),
        *_layer_rules(),
    ),
}
# Keys OpenLTM's model saves that ours computes: dropped on the way in, made on the way out.
OPENLTM_ONLY = {"Timer": ("position_embedding.pe",), "TimerXL": ()}
OPENLTM_PE_LEN = 6500  # OpenLTM layers/Embed.py PositionalEmbedding(max_len=6500)
OPENLTM_FILES = {"TimerXL": "models/timer_xl.py", "Timer": "models/timer.py"}
MODEL_NAMES = {"TimerXL": "Timer-XL", "Timer": "Timer"}


def _pattern(template):
    escaped = re.escape(template)
    escaped = escaped.replace(re.escape("{n}"), r"(?P<n>\d+)").replace(re.escape("{p}"), r"(?P<p>weight|bias)")
    return re.compile(escaped + "$")


_COMPILED = {model: [(rule, _pattern(rule.ours), _pattern(rule.openltm)) for rule in rules]
             for model, rules in KEY_TABLE.items()}


def _translate(key, model, to_openltm):
    """(the key in the other layout, its Rule), or None when no row matches."""
    for rule, ours, theirs in _COMPILED[model]:
        match = (ours if to_openltm else theirs).match(key)
        if match:
            target = rule.openltm if to_openltm else rule.ours
            return target.format(**match.groupdict()), rule
    return None


# ------------------------------------------------------------ recognising a state_dict
# thuml's models we have none of (OpenLTM's, and the Hugging Face releases): named when a file fits no model.
# thuml's Hugging Face releases are foundation models of their own, each with its folder and adapter
# (models/foundation/<release>/adapter.py); given to Timer or TimerXL, such a file is named by that adapter, which
# says which --model loads it.
LACKING = tuple(Lacking(pattern, what, why_not) for pattern, what, why_not in (
    (r"^encoder\.attn_layers\.\d+\.attention\.inner_attention\.attn_bias\.", "OpenLTM's Moirai (models/moirai.py: "
     "encoder.attn_layers.N; OpenLTM's Timer-XL before 2024-11-04 had this layout too)",
     "a masked encoder we have no model for"),
    (r"^patch_embedding\.value_embedding\.", "OpenLTM's MOMENT or PatchTST (models/moment.py: patch_embedding, "
     "encoder.attn_layers.N)", "an encoder with a flatten head we have no model for in OpenLTM's layout"),
    (r"^encoder\.attn_layers\.\d+\.attention\.query_projection\.", "OpenLTM's Timer from before 2024-11-04 "
     "(encoder.attn_layers.N)", "re-save it with OpenLTM's current code (blocks.attn_layers.N)"),
    (r"^backbone\.", "OpenLTM's TTM (models/ttm.py: backbone.*)", "a TSMixer backbone we have no model for"),
    (r"^gpt2\.", "OpenLTM's GPT4TS / OFA (models/gpt4ts.py: gpt2.*)", "a GPT-2 backbone we have no model for"),
    (r"^llm_model\.|^reprogramming_layer\.", "OpenLTM's Time-LLM (models/time_llm.py)",
     "a language-model backbone we have no model for"),
    (r"^model\.(h|model|transformer)\.", "OpenLTM's AutoTimes (models/autotimes.py: an LLM under model.*)",
     "a language-model backbone we have no model for"),
))

# A key only each layout has: OpenLTM's files, and ours (Timer-XL's variable bias; Timer's causal attention).
OPENLTM_VARIABLE_BIAS = r"^blocks\.attn_layers\.\d+\.attention\.inner_attention\.attn_bias\.emb\.weight$"
OPENLTM_PROJECTION = r"^blocks\.attn_layers\.\d+\.attention\.query_projection\.weight$"
OURS_SIGNATURE = {"TimerXL": r"^blocks\.layers\.\d+\.attention\.variable_bias\.emb\.weight$",
                  "Timer": r"^blocks\.layers\.\d+\.attention\.causal\.query\.weight$"}


def our_model_of(state):
    """"TimerXL" or "Timer" for one of our state_dicts of those models, else None."""
    return next((model for model, signature in OURS_SIGNATURE.items() if any_key(state, signature)), None)


class OpenLTMAdapter(CheckpointAdapter):
    """OpenLTM's checkpoint of its `model` ("TimerXL" / "Timer"), read into ours and written back."""
    export_format = "openltm"

    def __init__(self, model):
        self.model = model
        self.what = f"OpenLTM's {MODEL_NAMES[model]} ({OPENLTM_FILES[model]})"
        if model == "TimerXL":
            self.export_note = ("on more than one variable OpenLTM's Timer-XL computes what --timerxl_attention "
                                "openltm computes here, not the paper's attention (docs/openltm.md)")

    def recognise(self, state, config):
        # both have the query projections; only Timer-XL has the variable bias
        has_bias = any_key(state, OPENLTM_VARIABLE_BIAS)
        return has_bias if self.model == "TimerXL" else any_key(state, OPENLTM_PROJECTION) and not has_bias

    def to_ours(self, state, config):
        return openltm_to_ours(state, self.model)

    def holds_ours(self, state):
        return our_model_of(state) == self.model

    def from_ours(self, state):
        return ours_to_openltm(state, self.model)

    def shape_args(self, state):
        return shape_args(state, self.model)

    def loaded_note(self, model):
        if self.model == "TimerXL" and getattr(model, "attention_kind", None) == "paper":
            return ("OpenLTM's Timer-XL code attends differently from the paper's (rotary positions over the "
                    "flattened token index, the variable bias scaled with the scores, and with --covariate the "
                    "target reading every covariate token): the same on one variable, another function on "
                    "several; --timerxl_attention openltm computes OpenLTM's (docs/openltm.md)")
        return None


TIMER_XL, TIMER = OpenLTMAdapter("TimerXL"), OpenLTMAdapter("Timer")
ADAPTERS = (TIMER_XL, TIMER)  # `python -m exp.export export --to openltm` picks the one holding the file


# ------------------------------------------------------------ conversions
def openltm_to_ours(state, model):
    """OpenLTM's `model` ("TimerXL" / "Timer") state_dict in our layout. A key no row maps keeps its
    name, so the strict load names it as unexpected; OpenLTM's Timer positions are checked against
    ours and dropped."""
    out = {}
    for key, value in state.items():
        if key in OPENLTM_ONLY[model]:
            _check_positions(value, key)
            continue
        hit = _translate(key, model, to_openltm=False)
        if hit is None:
            out[key] = value
            continue
        name, rule = hit
        if rule.conv1x1:
            if value.dim() != 3 or value.shape[-1] != 1:
                raise UserError(f"{key} has shape {tuple(value.shape)}, not a kernel-size-1 Conv1d weight "
                                "[out, in, 1]: not a checkpoint of OpenLTM's code")
            value = value.squeeze(-1)
        out[name] = value
    return out


def ours_to_openltm(state, model):
    """Our TimerXL / Timer (`model`) state_dict in OpenLTM's layout, with the buffers OpenLTM saves."""
    out, unmapped = {}, []
    for key, value in state.items():
        hit = _translate(key, model, to_openltm=True)
        if hit is None:
            unmapped.append(key)
            continue
        name, rule = hit
        out[name] = value.unsqueeze(-1) if rule.conv1x1 else value
    if unmapped:
        raise UserError(f"{len(unmapped)} key(s) of this {model} have no place in OpenLTM's "
                        f"{OPENLTM_FILES[model]}: {', '.join(sorted(unmapped)[:6])}")
    if model == "Timer":
        d_model = state["embedding.weight"].shape[0]
        out["position_embedding.pe"] = positions_table(d_model, OPENLTM_PE_LEN).to(state["embedding.weight"].dtype)
    return out


def positions_table(d_model, length):
    """OpenLTM's (and TSLib's) fixed positions, [1, length, d_model]: the table of our SinusoidalPositions."""
    return sinusoid_table(length, d_model).unsqueeze(0)


def _check_positions(value, key):
    if value.dim() != 3 or value.shape[0] != 1:
        raise UserError(f"{key} has shape {tuple(value.shape)}, not OpenLTM's [1, length, d_model] positions")
    expected = positions_table(value.shape[-1], value.shape[1]).to(value.dtype)
    if not torch.allclose(value.float().cpu(), expected.float(), atol=1e-4, rtol=0):
        raise UserError(f"{key} is not the sinusoid table OpenLTM's Timer computes (our Timer recomputes it and "
                        "cannot load other positions)")


def shape_args(state, model):
    """The model arguments a TimerXL / Timer state_dict in our layout shows: e_layers, d_model, d_ff,
    n_heads (TimerXL only: Timer stores no per-head weight), input_token_len, output_token_len."""
    layers = {int(m.group(1)) for k in state for m in [re.match(r"blocks\.layers\.(\d+)\.", k)] if m}
    found = {"e_layers": max(layers) + 1 if layers else None}
    probes = {"d_model": ("embedding.weight", 0), "input_token_len": ("embedding.weight", 1),
              "d_ff": ("blocks.layers.0.linear1.weight", 0), "output_token_len": ("head.weight", 0)}
    if model == "TimerXL":
        probes["n_heads"] = ("blocks.layers.0.attention.variable_bias.emb.weight", 1)
    for name, (key, dim) in probes.items():
        value = state.get(key)
        found[name] = int(value.shape[dim]) if value is not None and value.dim() > dim else None
    return found
