"""The `trnf` Typer app: global options, command registration and the error boundary."""

from __future__ import annotations

import inspect
import os
import sys
from pathlib import Path
from typing import Any

import typer
import typer.main

from trnfrontier import __version__
from trnfrontier.cli import compare as compare_cmd
from trnfrontier.cli import doctor as doctor_cmd
from trnfrontier.cli import eval as eval_cmd
from trnfrontier.cli import init as init_cmd
from trnfrontier.cli import package as package_cmd
from trnfrontier.cli import prepare as prepare_cmd
from trnfrontier.cli import profile as profile_cmd
from trnfrontier.cli import recipes as recipes_cmd
from trnfrontier.cli import runs as runs_cmd
from trnfrontier.cli import sweep as sweep_cmd
from trnfrontier.cli import train as train_cmd
from trnfrontier.cli import verify as verify_cmd
from trnfrontier.errors import TrnfError
from trnfrontier.runtime.prepare_loader import PREPARE_ENV

try:  # typer >= 0.22 vendors click; older releases depend on it
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - depends on the installed typer
    from click.exceptions import ClickException  # type: ignore[no-redef,assignment,unused-ignore]

def _show_flags_as_flags() -> None:
    """Help lists a boolean flag (``--json``, ``--dry-run``, ``--help``) without a value type.

    Typer 0.2x's rich help prints ``<bool>`` beside every flag, as if it took a value; the
    option's own ``is_flag`` says it does not. Patched once, here, so every command (and any
    added later) gets it."""
    from typer.core import TyperOption

    original = getattr(TyperOption, "display_type_rich", None)
    if original is None or getattr(original, "_trnf_flags", False):
        return

    def display_type_rich(self: TyperOption, ctx: typer.Context) -> str | None:
        if getattr(self, "is_flag", False) and not getattr(self, "count", False):
            return None
        return original(self, ctx)

    display_type_rich._trnf_flags = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign,assignment]


_show_flags_as_flags()

app = typer.Typer(
    name="trnf",
    help="Prepare, train, evaluate, profile, package and verify AWS Trainium Frontier submissions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"trnf {__version__}")
        raise typer.Exit()


@app.callback()
def global_options(
    prepare: Path | None = typer.Option(
        None, "--prepare", envvar=PREPARE_ENV, help="The trusted prepare.py to use (default: the project's own)."
    ),
    home: Path | None = typer.Option(
        None,
        "--home",
        envvar="TRNF_HOME",
        help="Data and cache root: $NEURON_COMPETITION_R1_CACHE_DIR when set (the kit's variable wins), "
        "else this, else ~/.cache/trnfrontier.",
    ),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version and exit."),
) -> None:
    """Options every command shares. They are exported to the environment so that
    subprocesses (torchrun workers, fresh eval processes) see the same choices."""
    if prepare is not None:
        resolved = prepare.expanduser().resolve()
        if not resolved.is_file():
            raise TrnfError(f"--prepare {prepare}: no such file; give the path of a trusted prepare.py", exit_code=2)
        os.environ[PREPARE_ENV] = str(resolved)
    if home is not None:
        resolved_home = home.expanduser().resolve()
        if resolved_home.exists() and not resolved_home.is_dir():
            raise TrnfError(f"--home / TRNF_HOME {home}: not a directory; give the data and cache folder", exit_code=2)
        os.environ["TRNF_HOME"] = str(resolved_home)


app.command("prepare")(prepare_cmd.command)
app.command("train", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(train_cmd.command)
app.command("eval")(eval_cmd.command)
app.command("profile", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(profile_cmd.command)
app.command("package")(package_cmd.command)
app.command("verify")(verify_cmd.command)
app.command("init")(init_cmd.command)
app.command("doctor")(doctor_cmd.command)
app.add_typer(recipes_cmd.app, name="recipes")
app.add_typer(runs_cmd.app, name="runs")
app.command("compare")(compare_cmd.command)
app.command("sweep")(sweep_cmd.command)


def _flow_help(command: Any) -> None:
    """Join the hard-wrapped lines of every help paragraph, in this command and below it.

    Docstrings wrap at the source's line length; Typer's rich help keeps those breaks in the
    `trnf --help` command list and in later paragraphs, so lines came out ragged. Paragraphs
    (blank-line separated) stay apart."""
    if command.help:
        paragraphs = inspect.cleandoc(command.help).split("\n\n")
        command.help = "\n\n".join(" ".join(p.split()) for p in paragraphs)
    for sub in getattr(command, "commands", {}).values():
        _flow_help(sub)


def cli_command() -> Any:
    """The click command `trnf` runs: the Typer app with its help paragraphs flowed."""
    command = typer.main.get_command(app)
    _flow_help(command)
    return command


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: one clear line and an exit code, never a traceback for bad input."""
    try:
        result = cli_command()(args=argv, prog_name="trnf", standalone_mode=False)
    except TrnfError as exc:
        sys.stderr.write(f"trnf: error: {exc}\n")
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(getattr(exc, "exit_code", 0))
    except ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except OSError as exc:
        # A read-only --out, a full disk, a folder without permission: the path and what to
        # do, not a traceback. Other OSErrors are bugs and keep theirs.
        from trnfrontier.runtime.faults import describe, is_user_facing

        if not is_user_facing(exc):
            raise
        sys.stderr.write(f"trnf: error: {describe(exc)}\n")
        sys.exit(1)
    except (KeyboardInterrupt, typer.Abort):
        sys.stderr.write("trnf: interrupted\n")
        sys.exit(130)
    sys.exit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
