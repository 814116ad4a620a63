"""The command line's own usage errors in the project's one-line form, and help without clutter.

Typer (through its vendored click) answers a bad option value, a missing argument or an unknown
option with a usage line, a hint and a boxed panel. Here every such error becomes one line on
stderr, `error: <option>: <value> is not valid; <fix>`, exit code 2, whatever the verb; the fix
is written from what the option declares (its type, range or choices, its help). Help shows no
`<bool>` type for switches and names positional arguments in capitals.
"""

from __future__ import annotations

import difflib
import sys
from typing import Any

import typer
from typer import _click as click  # typer >= 0.29 vendors click: its exceptions are these
from typer._click import exceptions as errors
from typer.core import TyperCommand, TyperGroup

from trainables.errors import SHOWN_CHARS

USAGE_EXIT = 2


class TidyHelp:
    """Help for a verb or the group: no `<bool>` type for switches, positional arguments in capitals."""

    params: list[click.Parameter]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            tidy_metavar(param)

    def get_help_option(self, ctx: click.Context):
        option = super().get_help_option(ctx)
        if option is not None:
            tidy_metavar(option)
        return option


class OneLineCommand(TidyHelp, TyperCommand):
    """A verb whose parse errors carry the raw value the user gave (for the one-line message), whose
    extra arguments are an error of its own, and whose help hides switch types."""

    allow_extra_args = True  # checked below, so the error can name the extra argument

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # the parser consumes the list it is given
        try:
            rest = super().parse_args(ctx, args)
        except errors.UsageError as exc:
            exc.given = given  # type: ignore[attr-defined]
            exc.ctx = exc.ctx or ctx  # the option parser raises without one
            if isinstance(exc, errors.BadParameter):
                exc.raw_value = raw_value(self, ctx, given, exc.param)  # type: ignore[attr-defined]
            raise
        if rest and not ctx.resilient_parsing:
            raise ExtraArguments(rest, ctx)
        return rest

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        """`[OPTIONS] STUDY_FILE`, `[OPTIONS] NAMES...`: click's usage, not typer's `{STUDY_FILE}`."""
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if param.param_type_name == "argument":
                name = param.metavar or param.name.upper()
                name = name if param.required else f"[{name}]"
                pieces.append(name + ("..." if param.nargs != 1 else ""))
        return pieces


class ExtraArguments(errors.UsageError):
    def __init__(self, extra: list[str], ctx: click.Context) -> None:
        super().__init__(f"unexpected extra arguments {extra}", ctx)
        self.extra = extra


class OneLineGroup(TidyHelp, TyperGroup):
    """The `orchestrator` group: runs a verb and turns any usage error into one line and exit code 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode: bool = True, **extra: Any):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except errors.NoArgsIsHelpError:
            sys.exit(USAGE_EXIT)  # the help was printed already
        except errors.ClickException as exc:
            typer.echo(f"error: {usage_error_line(exc)}", err=True)
            sys.exit(USAGE_EXIT if isinstance(exc, errors.UsageError) else exc.exit_code)
        except typer.Abort:
            typer.echo("aborted", err=True)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


class OrchestratorTyper(typer.Typer):
    """A Typer whose group and verbs use the classes above unless a verb names its own."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(cls=OneLineGroup, **kwargs)

    def command(self, name: str | None = None, *, cls: type[TyperCommand] | None = None, **kwargs: Any):
        return super().command(name, cls=cls or OneLineCommand, **kwargs)


def tidy_metavar(param: click.Parameter) -> None:
    """Switches show no `<bool>`; a positional argument is named in capitals (`STUDY_FILE`)."""
    if param.metavar is not None:
        return
    if getattr(param, "is_flag", False):
        param.metavar = ""
    elif param.param_type_name == "argument":
        param.metavar = param.name.upper()


def raw_value(command: click.Command, ctx: click.Context, args: list[str], param) -> Any:
    """What the user typed for `param` (parsed again from the untouched arguments)."""
    if param is None:
        return None
    try:
        opts, _, _ = command.make_parser(ctx).parse_args(args=list(args))
    except errors.UsageError:
        return None
    return opts.get(param.name)


def shown(value: Any) -> str:
    """A value as the project's errors show it: numbers bare, text quoted (control characters escaped)."""
    if isinstance(value, list | tuple):
        value = value[0] if len(value) == 1 else list(value)
    if isinstance(value, str):
        for number in (int, float):
            try:
                parsed = number(value)
            except ValueError:
                continue
            if repr(parsed) == value.strip():
                return value.strip()
    text = repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + f"… ({len(text):,} characters)"


def option_name(param) -> str:
    if param is None:
        return "value"
    if param.param_type_name == "argument":
        return param.metavar or param.name.upper()
    return max(param.opts, key=len)


def expected(param) -> str:
    """The fix for a bad value, from what the option declares: its type, range or choices."""
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is not None and descriptor.is_choice and descriptor.choices:
        return "use one of: " + ", ".join(str(getattr(c, "value", c)) for c in descriptor.choices)
    annotation = getattr(descriptor, "annotation", None)
    kind = {int: "a whole number", float: "a number"}.get(annotation)
    if kind is None:
        return f"see `{option_name(param)}` in --help"
    low, high = getattr(param, "min", None), getattr(param, "max", None)
    if low is not None and high is not None:
        return f"give {kind} from {low} to {high}"
    if low is not None:
        return f"give {kind} of at least {low}"
    if high is not None:
        return f"give {kind} of at most {high}"
    return f"give {kind}"


def described(param) -> str:
    """The option's help, as the tail of a fix (`: folder of study folders …`)."""
    text = " ".join((getattr(param, "help", None) or "").split()).rstrip(".")
    return f": {text[:1].lower() + text[1:]}" if text else ""


def usage_error_line(exc: errors.ClickException) -> str:
    """One line for a click/typer usage error, in the project's form `<key>: <value> is not valid; <fix>`."""
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else "orchestrator"
    helps = f"`{path} --help` lists them"
    if isinstance(exc, errors.MissingParameter):
        name = option_name(exc.param)
        how = f"usage: {path} {' '.join(ctx.command.collect_usage_pieces(ctx))}" if ctx is not None else helps
        if exc.param is not None and exc.param.param_type_name == "option":
            how = f"give {name} VALUE{described(exc.param)}"
        return f"{name} is missing; {how}"
    if isinstance(exc, errors.BadParameter):
        name = option_name(exc.param)
        return f"{name}: {shown(getattr(exc, 'raw_value', None))} is not valid; {expected(exc.param)}"
    if isinstance(exc, errors.NoSuchOption):
        close = difflib.get_close_matches(exc.option_name, exc.possibilities or [], n=1) or sorted(
            exc.possibilities or [])[:1]
        hint = f"did you mean {close[0]}? " if close else ""
        return f"{exc.option_name}: no such option of `{path}`; {hint}{helps}"
    if isinstance(exc, errors.BadOptionUsage):
        param = next((p for p in ctx.command.params if exc.option_name in getattr(p, "opts", ())), None) \
            if ctx is not None else None
        if "does not take a value" in exc.message:
            typed = next((a.split("=", 1)[1] for a in getattr(exc, "given", []) if a.startswith(exc.option_name + "=")),
                         None)
            return f"{exc.option_name}: {shown(typed)} is not valid; it is a switch: give {exc.option_name} alone"
        return f"{exc.option_name} is missing its value; give {exc.option_name} VALUE{described(param)}"
    if isinstance(exc, ExtraArguments):
        usage = f"{path} {' '.join(ctx.command.collect_usage_pieces(ctx))}"
        return f"{shown(exc.extra)}: an extra argument is not valid; usage: {usage}"
    if isinstance(exc, errors.UsageError) and ctx is not None and exc.message.startswith("No such command"):
        typed = exc.message.split("'")[1] if "'" in exc.message else exc.message
        close = difflib.get_close_matches(typed, list(getattr(ctx.command, "commands", {})), n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        return f"{shown(typed)}: no such command; {hint}`{path} --help` lists the commands"
    message = " ".join(exc.format_message().split())
    return f"{path}: {message[:1].lower() + message[1:].rstrip('.')}; `{path} --help` shows the usage"
