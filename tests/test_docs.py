"""The documentation keeps its promises: the one model template (models/README.md) passes the model contract,
every relative link in README.md, models/README.md and docs/ resolves, and every command README.md and docs/
name refers to a script, file or module that exists. Cheap: nothing is run but the template's contract
clauses (two DDP steps included; about 15 s on idle cores)."""
import importlib.util
import re
from pathlib import Path

import pytest

import test_model_contract as contract
from helpers import REPO, run_on_ranks
from test_model_contract import undated_data  # noqa: F401 (a fixture the output-shape clause needs)

TEMPLATE_DOC = REPO / "models" / "README.md"
TEMPLATE_HEADING = "## The template"
DOCS = [REPO / "README.md", TEMPLATE_DOC, *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "models" / "foundation").glob("*/README.md"))]  # each release's page

FENCED_PYTHON = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
# [text](target) and ![alt](target); a target ends at whitespace or the closing parenthesis
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
COMMANDS = {  # what a command line names -> how to tell it exists
    "script": re.compile(r"\bbash\s+(scripts/\S+\.sh)\b"),
    "module": re.compile(r"\bpython3?\s+(?:-u\s+)?-m\s+([A-Za-z_][\w.]*)"),
    "file": re.compile(r"\bpython3?\s+(?:-u\s+)?([\w/]+\.py)\b"),
}


def template_source(text):
    """The first fenced python block after the template heading of models/README.md."""
    start = text.index(TEMPLATE_HEADING)
    block = FENCED_PYTHON.search(text, start)
    assert block, f"no ```python block after '{TEMPLATE_HEADING}' in {TEMPLATE_DOC.relative_to(REPO)}"
    return block.group(1)


def model_spec_from(source, folder, name="MyModel"):
    """The template written as models/<name>.py in a folder of its own, as the contract loads such files."""
    path = Path(folder) / f"{name}.py"
    path.write_text(source)
    return contract.ModelSpec(name, str(path), zoo=True)  # held to the zoo's clauses too: the zoo copies it


def check_whole_contract(spec, folder, undated_args):
    """Every clause of tests/test_model_contract.py, as it holds each models/<Name>.py to them."""
    contract.check_template(spec)
    contract.check_house_style(spec)
    for features, batch_size, undated in contract.SHAPE_CASES.values():
        contract.check_output_shape(spec, features, batch_size, undated_args if undated else ())
    contract.check_gradients(spec)
    contract.check_half_precision(spec)
    contract.check_same_seed(spec)
    contract.check_state_dict_round_trip(spec, Path(folder))
    contract.check_declared_inputs(spec)
    contract.check_windows_independent(spec)
    per_rank = run_on_ranks(contract.ddp_training_steps, 2, [tuple(spec)], timeout=300)
    contract.check_ddp_step(spec, per_rank)


def test_the_model_template_passes_the_model_contract(tmp_path, undated_data):  # noqa: F811
    """A researcher who copies the template gets a model that passes every clause."""
    spec = model_spec_from(template_source(TEMPLATE_DOC.read_text()), tmp_path)
    check_whole_contract(spec, tmp_path, undated_data)


def test_a_template_with_required_forward_arguments_is_caught(tmp_path):
    """The README once showed forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec), which the contract
    rejects (token models are called with None for the decoder inputs): this test would notice it."""
    source = template_source(TEMPLATE_DOC.read_text())
    broken = re.sub(r"def forward\(self, [^)]*\)", "def forward(self, x_enc, x_mark_enc, x_dec, x_mark_dec)", source)
    assert broken != source, "the template has no forward(self, ...) to break"
    with pytest.raises(contract.ContractViolation, match="house style"):
        contract.check_house_style(model_spec_from(broken, tmp_path, name="OldTemplate"))


def test_there_is_one_model_template():
    """Only models/README.md shows a whole model; every other page links to it."""
    holders = [doc.relative_to(REPO).as_posix() for doc in DOCS
               if any("def forward(" in block for block in FENCED_PYTHON.findall(doc.read_text()))]
    assert holders == ["models/README.md"], f"model templates in {holders}; keep the one in models/README.md"


def heading_anchors(text):
    """GitHub's anchors for a markdown file's headings (lower case, punctuation dropped, spaces to '-')."""
    anchors = set()
    for heading in re.findall(r"^#+\s+(.*?)\s*$", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M), re.M):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-"))
    return anchors


def outside_code(text):
    """The text without fenced blocks and inline code, where a [x](y) is not a link."""
    return re.sub(r"`[^`\n]*`", "", re.sub(r"^```.*?^```", "", text, flags=re.S | re.M))


def link_problems(doc, text):
    problems = []
    for target in LINK.findall(outside_code(text)):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        resolved = (doc.parent / path_part).resolve() if path_part else doc
        if not resolved.is_relative_to(REPO):
            problems.append(f"{target} leaves the repository")
        elif not resolved.exists():
            problems.append(f"{target} does not exist")
        elif anchor and resolved.suffix == ".md" and anchor not in heading_anchors(resolved.read_text()):
            problems.append(f"{target}: no heading '#{anchor}' in {resolved.relative_to(REPO)}")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.relative_to(REPO).as_posix())
def test_relative_links_resolve(doc):
    """Every relative link (and picture) points to a file or folder in the repository, and a #section
    to a heading of that file."""
    problems = link_problems(doc, doc.read_text())
    assert not problems, f"{doc.relative_to(REPO)}: " + "; ".join(problems)


def test_broken_links_are_noticed():
    """What moving a section to docs/ tends to break: a path still relative to the root, a renamed
    heading, a link out of the repository. Links in code are not links."""
    text = ("[a](ddp.md#checkpoints) ![b](forecast.png) [c](https://example.org/x) `[d](nowhere.md)`\n"
            "[e](benchmarks/README.md) [f](ddp.md#no-such-section) [g](../../shared/reference/targets.md)\n")
    assert link_problems(REPO / "docs" / "page.md", text) == [
        "benchmarks/README.md does not exist", "ddp.md#no-such-section: no heading '#no-such-section' in docs/ddp.md",
        "../../shared/reference/targets.md leaves the repository"]


def module_exists(name):
    relative = Path(*name.split("."))
    if (REPO / relative).with_suffix(".py").is_file() or (REPO / relative / "__init__.py").is_file():
        return True
    if (REPO / name.split(".")[0]).exists():  # one of ours, but not there
        return False
    return importlib.util.find_spec(name.split(".")[0]) is not None  # pytest, pip, torch, ...


def named_commands(text):
    return {kind: sorted(set(pattern.findall(text))) for kind, pattern in COMMANDS.items()}


def missing_commands(named):
    missing = [f"bash {path}" for path in named["script"] if not (REPO / path).is_file()]
    missing += [f"python -m {name}" for name in named["module"] if not module_exists(name)]
    missing += [f"python {path}" for path in named["file"] if not (REPO / path).is_file()]
    return missing


# models/README.md is left out: its examples run scripts the reader is about to write.
@pytest.mark.parametrize("doc", [DOCS[0], *DOCS[2:]], ids=lambda path: path.relative_to(REPO).as_posix())
def test_commands_exist(doc):
    """`bash scripts/...`, `python -m X` and `python <file>.py` in README.md and docs/ name what the tree holds."""
    missing = missing_commands(named_commands(doc.read_text()))
    assert not missing, f"{doc.relative_to(REPO)} names what does not exist: {', '.join(missing)}"


def test_the_quick_start_commands_are_checked():
    """The command patterns find the README's quick start, and a renamed module or script is noticed."""
    named = named_commands((REPO / "README.md").read_text())
    assert "scripts/ddp_forecast.sh" in named["script"] and "pytest" in named["module"], named
    planted = named_commands("python -m utils.gone results/ && bash scripts/gone.sh && python benchmarks/gone.py")
    assert missing_commands(planted) == ["bash scripts/gone.sh", "python -m utils.gone", "python benchmarks/gone.py"]


def test_the_readme_is_a_front_door():
    """README.md says what the project is and where to read on; the history of measurements lives in
    docs/ (issue 37: it had grown to 311 lines). Every page of docs/ is one link away."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150, f"README.md has {len(text.splitlines())} lines; move detail into docs/"
    linked = {target.partition("#")[0] for target in LINK.findall(outside_code(text))}
    unlinked = [page for page in sorted((REPO / "docs").glob("*.md")) if f"docs/{page.name}" not in linked]
    assert not unlinked, f"README.md links no {', '.join(page.name for page in unlinked)}"
