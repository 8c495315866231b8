"""launch.txt: the one launch shape the organisers run, and nothing else.

Grammar, after ``shlex`` tokenising in POSIX mode with punctuation characters split out
(so ``;``, ``|``, ``&``, ``>``, ``<``, ``(``, ``)`` become their own tokens and are refused)::

    NEURON_LOGICAL_NC_CONFIG=(1|2) torchrun --standalone --nproc_per_node=(1|4|8) train.py

Exactly these five tokens in this order. Any other byte that a shell would treat
specially (``$``, backquotes, newlines beyond a trailing one, ``#``) is refused before
tokenising, so command substitution and comments cannot hide in a token. The LNC and
nproc choices (and which pairs go together) are the phase's (``contract.phases``); the
grammar above is Phase 1's, the default.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from trnfrontier.contract.phases import DEFAULT_PHASE, PHASES, Phase

# Phase 1's launch shapes (one Trainium2 chip): NEURON_LOGICAL_NC_CONFIG and
# nproc_per_node. The grammar below and trnf train / package / init check against these.
LNC_CHOICES = PHASES[DEFAULT_PHASE].lnc_choices
NPROC_CHOICES = PHASES[DEFAULT_PHASE].nproc_choices

_SHELL_SPECIAL = set("$`\\\"'#*?[]{}~!")


def _word(prefix: str, choices: tuple[int, ...]) -> re.Pattern[str]:
    return re.compile(rf"^{prefix}({'|'.join(map(str, choices))})$")


def _alternatives(choices: tuple[int, ...]) -> str:
    """``<1|4|8>``: the choices as the grammar's summary writes them."""
    return f"<{'|'.join(map(str, choices))}>"


def choices_text(choices: tuple[int, ...], last: str = " or ") -> str:
    """``1, 4 or 8``: the choices as a message names them."""
    words = [str(c) for c in choices]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])}{last}{words[-1]}"


def launch_line(nproc: int | str, lnc: int | str, script: str = "train.py") -> str:
    """The launch command as the organisers write it (``script`` other than train.py only for local runs)."""
    return f"NEURON_LOGICAL_NC_CONFIG={lnc} torchrun --standalone --nproc_per_node={nproc} {script}"


@dataclass(frozen=True)
class Launch:
    lnc: int
    nproc: int


class LaunchError(ValueError):
    pass


def parse_launch(text: str, phase: Phase = PHASES[DEFAULT_PHASE]) -> Launch:
    """Parse launch.txt content, or raise LaunchError naming what is wrong (the shapes
    ``phase`` accepts; Phase 1's by default)."""
    lncs, nprocs = phase.lnc_choices, phase.nproc_choices
    line = text[:-1] if text.endswith("\n") else text
    if "\n" in line or "\r" in line:
        raise LaunchError("launch.txt must be a single line")
    bad = sorted(set(line) & _SHELL_SPECIAL)
    if bad:
        raise LaunchError(f"launch line contains shell syntax {' '.join(bad)!s}; only the plain launch command is allowed")
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError as exc:
        raise LaunchError(f"launch line does not tokenise: {exc}") from None
    operators = [t for t in tokens if t and set(t) <= set("();<>|&")]
    if operators:
        raise LaunchError(f"launch line contains {operators[0]!r} (pipes, redirects, chaining and backgrounding are not allowed)")
    expected = launch_line(_alternatives(nprocs), _alternatives(lncs))
    if len(tokens) != 5:
        raise LaunchError(f"launch line has {len(tokens)} words, expected exactly: {expected}")
    env, exe, standalone, nproc, script = tokens
    env_match = _word("NEURON_LOGICAL_NC_CONFIG=", lncs).match(env)
    if not env_match:
        raise LaunchError(f"first word {env!r} must be NEURON_LOGICAL_NC_CONFIG={choices_text(lncs, ' or =')} (and no other variable)")
    if exe != "torchrun":
        raise LaunchError(f"launcher {exe!r} must be torchrun")
    if standalone != "--standalone":
        raise LaunchError(f"expected --standalone after torchrun, got {standalone!r}")
    nproc_match = _word("--nproc_per_node=", nprocs).match(nproc)
    if not nproc_match:
        raise LaunchError(f"{nproc!r} must be --nproc_per_node={choices_text(nprocs)}")
    if script != "train.py":
        raise LaunchError(f"the script must be train.py, got {script!r}")
    launch = Launch(lnc=int(env_match.group(1)), nproc=int(nproc_match.group(1)))
    if not phase.accepts(launch.lnc, launch.nproc):
        raise LaunchError(
            f"Phase {phase.number} runs {phase.shapes_text()} (the whole {phase.instance}); "
            f"got --nproc_per_node={launch.nproc} with LNC {launch.lnc}"
        )
    return launch
