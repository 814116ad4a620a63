"""Usage errors of every verb (bad option values, missing arguments, unknown options) are one line
in the project's form and exit code 2; help shows no `<bool>` and explains every argument."""

from __future__ import annotations

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from orchestrator.cli import app

runner = CliRunner()
GROUP = typer.main.get_command(app)
VERBS = dict(GROUP.commands)


def required_args(verb: str) -> list[str]:
    """The least a verb needs to get past parsing: a value for each required argument and option."""
    args = []
    for param in VERBS[verb].params:
        if param.required:
            value = "0" if param.type_descriptor.annotation in (int, float) else "x"  # a number parses as one
            args += [value] if param.param_type_name == "argument" else [param.opts[0], value]
    return args


def numeric_options() -> list[tuple[str, object]]:
    return [(verb, p) for verb, command in VERBS.items() for p in command.params
            if p.param_type_name == "option" and p.type_descriptor.annotation in (int, float)]


def ranged_cases() -> list[tuple[str, str, str, str]]:
    """(verb, option, bad value, fix) for every declared bound, one step outside it."""
    cases = []
    for verb, param in numeric_options():
        kind = "a whole number" if param.type_descriptor.annotation is int else "a number"
        low, high = param.min, param.max
        fix = (f"give {kind} from {low} to {high}" if low is not None and high is not None else
               f"give {kind} of at least {low}" if low is not None else
               f"give {kind} of at most {high}" if high is not None else f"give {kind}")
        option = max(param.opts, key=len)
        if low is not None:
            cases.append((verb, option, str(low - 1), fix))
        if high is not None:
            cases.append((verb, option, str(high + 1), fix))
        cases.append((verb, option, "many", fix))
    return cases


def one_line(args: list[str]):
    result = runner.invoke(app, args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, (args, result.output)
    assert len(lines) == 1 and lines[0].startswith("error: "), (args, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.output
    return lines[0]


def test_the_issues_example_is_one_line_exit_2():
    assert one_line(["launch", "--max-concurrent", "-1", "study.yaml"]) == (
        "error: --max-concurrent: -1 is not valid; give a whole number of at least 1")


def test_every_numeric_option_declares_a_range_where_it_has_one():
    """Counts, ports and lengths have bounds; the cases below cover each of them."""
    declared = {(verb, max(p.opts, key=len)): (p.min, p.max) for verb, p in numeric_options()}
    assert declared[("launch", "--max-concurrent")] == (1, None)
    assert declared[("resume", "--max-concurrent")] == (1, None)
    assert declared[("ui", "--port")] == (1, 65535)
    assert declared[("probe", "--max-seq-length")] == (2, None)
    assert declared[("probe", "--max-eval-samples")] == (1, None)


@pytest.mark.parametrize(("verb", "option", "value", "fix"), ranged_cases())
def test_a_value_outside_an_options_declared_range_is_one_line(verb, option, value, fix):
    shown = value if value.lstrip("-").replace(".", "", 1).isdigit() else repr(value)  # numbers unquoted
    assert one_line([verb, *required_args(verb), option, value]) == f"error: {option}: {shown} is not valid; {fix}"


@pytest.mark.parametrize("verb", [v for v in VERBS if any(p.required for p in VERBS[v].params)])
def test_a_missing_argument_or_option_is_one_line_naming_it(verb):
    missing = next(p for p in VERBS[verb].params if p.required)
    name = missing.metavar if missing.param_type_name == "argument" else missing.opts[0]
    assert one_line([verb]).startswith(f"error: {name} is missing; ")


@pytest.mark.parametrize(("args", "line"), [
    (["launch", "s.yaml", "--bogus"],
     "error: --bogus: no such option of `root launch`; `root launch --help` lists them"),
    (["launch", "s.yaml", "--max-concurent", "2"], "error: --max-concurent: no such option of `root launch`; did you "
                                                   "mean --max-concurrent? `root launch --help` lists them"),
    (["status", "s", "--storage"], "error: --storage is missing its value; give --storage VALUE: folder of study "
                                   "folders (default: the study's storage_path or ./studies)"),
    (["launch", "--resume=yes", "s.yaml"], "error: --resume: 'yes' is not valid; it is a switch: give --resume alone"),
    (["status", "a", "b"], "error: 'b': an extra argument is not valid; usage: root status [OPTIONS] NAME"),
    (["lunch", "s.yaml"], "error: 'lunch': no such command; did you mean launch? `root --help` lists the commands"),
    (["--bogus"], "error: --bogus: no such option of `root`; `root --help` lists them"),
])
def test_usage_mistakes_are_one_line_with_the_fix(args, line):
    assert one_line(args) == line


BAD_NUMBERS = st.one_of(
    st.integers(max_value=0).map(str), st.integers(min_value=65536).map(str),
    st.text(min_size=1, max_size=30).filter(lambda t: not t.startswith("-")),
    st.floats(allow_nan=True, allow_infinity=True).map(repr))


def in_range(value: str, param) -> bool:
    try:  # typer takes what pydantic's lax mode takes: " 5 ", "5.0"
        number = float(value.strip())
    except ValueError:
        return False
    if not number.is_integer() and param.type_descriptor.annotation is int or number != number:
        return False  # a fraction is no whole number; NaN is in no range
    return (param.min is None or number >= param.min) and (param.max is None or number <= param.max)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(numeric_options()), value=BAD_NUMBERS)
def test_any_out_of_range_or_non_numeric_value_of_any_option_is_one_line_exit_2(case, value):
    verb, param = case
    if in_range(value, param):
        return  # a valid value: not this test's business
    option = max(param.opts, key=len)
    assert one_line([verb, *required_args(verb), option, value]).startswith(f"error: {option}: ")


@settings(max_examples=100, deadline=None)
@given(verb=st.sampled_from(sorted(VERBS)), word=st.from_regex(r"--[a-z][a-z-]{0,20}", fullmatch=True))
def test_any_unknown_option_of_any_verb_is_one_line_exit_2(verb, word):
    if any(word in p.opts for p in VERBS[verb].params) or word == "--help":
        return
    assert one_line([verb, *required_args(verb), word]).startswith(f"error: {word}: no such option of ")


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_help_explains_every_argument_and_option_without_type_clutter(verb):
    command = VERBS[verb]
    undocumented = [p.name for p in command.params if not (getattr(p, "help", None) or "").strip()]
    assert undocumented == [], f"{verb}: no help text for {undocumented}"
    result = runner.invoke(app, [verb, "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout and "{" not in result.stdout.split("\n\n")[0]
    for param in command.params:
        assert (param.metavar if param.param_type_name == "argument" else param.opts[0]) in result.stdout
