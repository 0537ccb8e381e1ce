"""The code in the README and docs/ is true to the code base: every Python snippet parses,
the complete ones marked ``<!-- runnable -->`` run, every ``exactly`` command line names a
command and options the CLI has, and every script and benchmark a line names exists.

A snippet's marker is an HTML comment on the line before its fence: ``<!-- runnable -->``
(a complete program that needs no Spark and no server: run here, in a temporary directory)
or ``<!-- fragment -->`` (deliberately not Python on its own: not parsed; keep it rare).
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from exactly.cli import main

ROOT = Path(__file__).parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKERS = {"runnable", "fragment"}
MARKER = re.compile(r"^<!--\s*([\w-]+)\s*-->$")
FENCE = re.compile(r"^(\s*)```([\w-]*)\s*$")
SHELL = {"bash", "sh", "console", ""}  # an unlabelled block: only its `$ ` lines are commands
#: tokens that end one command of a shell line and may start the next
SEPARATORS = {"|", "||", "&&", ";", "&"}
#: paths of the repository a line may name: scripts and benchmarks
NAMED_PATH = re.compile(r"(?<![\w/.-])(?:\./)?((?:scripts/[\w./*-]+)|(?:bench/[\w/*-]+\.py))")


@dataclass(frozen=True)
class Snippet:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def snippets(page: Path) -> list[Snippet]:
    """Every fenced code block of ``page``, with the marker on the line before it."""
    found: list[Snippet] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang = opening.groups()
        previous = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()),
                        "")
        marker = MARKER.match(previous)
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        body = [line[len(indent):] if line.startswith(indent) else line
                for line in lines[i + 1:end]]
        found.append(Snippet(page, i + 1, lang, textwrap.dedent("\n".join(body)) + "\n",
                             marker.group(1) if marker else None))
        i = end + 1
    return found


ALL = [s for page in PAGES for s in snippets(page)]
PYTHON = [s for s in ALL if s.lang == "python" and s.marker != "fragment"]
RUNNABLE = [s for s in ALL if s.marker == "runnable"]
SHELL_SNIPPETS = [s for s in ALL if s.lang in SHELL]


def shell_commands(snippet: Snippet) -> list[str]:
    """The command lines of a shell block, continuation lines joined: a trailing backslash
    or a quote still open continues a command. In a ``console`` block only lines after a
    ``$`` prompt are commands (the rest is output); in an unlabelled block also a line that
    starts with ``exactly`` (a usage line)."""
    prompted = snippet.lang in ("console", "")
    commands: list[str] = []
    current: str | None = None
    for line in snippet.code.splitlines():
        if current is None:
            stripped = line.strip()
            if stripped.startswith("$ "):
                stripped = stripped[2:]
            elif prompted and not (snippet.lang == "" and stripped.startswith("exactly ")):
                continue
            if not stripped or stripped.startswith("#"):
                continue
            current = stripped
        else:
            current += ("\n" if _open_quote(current) else " ") + line.strip()
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        if _open_quote(current):
            continue
        commands.append(current)
        current = None
    if current is not None:
        commands.append(current)
    return commands


def _open_quote(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:
        return True
    return False


def exactly_invocations(command: str) -> list[list[str]]:
    """The argument lists of every ``exactly`` this shell command runs: at the start, after
    variable assignments, after ``|``/``&&``/``;``, or inside ``$(...)``."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars="|&;()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    tokens = list(lexer)
    found: list[list[str]] = []
    starts_command = True
    for i, token in enumerate(tokens):
        if token in SEPARATORS or token in ("(", "$"):
            starts_command = True
            continue
        if starts_command and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", token):
            continue  # VAR=value before the command
        if starts_command and (token == "exactly" or token.endswith("/exactly")):
            args = []
            for arg in tokens[i + 1:]:
                if arg in SEPARATORS or arg == ")":
                    break
                args.append(arg)
            found.append(args)
        starts_command = token.endswith("$")  # `$(` splits into `$`, `(`
    return found


def option_names(command: click.Command) -> dict[str, bool]:
    """Every option of ``command`` (``--help`` included), and whether it takes a value."""
    names = {"--help": False}
    for param in command.params:
        if isinstance(param, click.Option):
            takes_value = not param.is_flag and not param.count
            for name in (*param.opts, *param.secondary_opts):
                names[name] = takes_value
    return names


def check_invocation(args: list[str]) -> list[str]:
    """What is wrong with ``exactly ARGS`` against the CLI: an unknown command, or an
    option its command (or the group, before the command) does not have."""
    problems: list[str] = []
    group_options = option_names(main)
    rest = list(args)
    while rest and rest[0].startswith("-"):
        if rest[0] not in group_options:
            problems.append(f"exactly has no option {rest[0]}")
        rest.pop(0)
    if not rest:
        return problems
    name, *rest = rest
    command = main.commands.get(name)
    if command is None:
        return [*problems, f"exactly has no command {name!r}"]
    options = option_names(command)
    skip_value = False
    for arg in rest:
        if skip_value:
            skip_value = False
            continue
        token = arg.strip("[]()|")  # a usage line's brackets: [--json], [--a | --b]
        if not re.match(r"^--?[A-Za-z]", token):
            continue  # an argument, a value, a placeholder (...)
        option, _, value = token.partition("=")
        if option not in options:
            problems.append(f"exactly {name} has no option {option}")
            continue
        skip_value = options[option] and not value
    return problems


@pytest.mark.parametrize("snippet", PYTHON, ids=lambda s: s.where)
def test_every_python_snippet_parses(snippet):
    ast.parse(snippet.code, snippet.where)


def test_snippet_markers_stand_only_before_python_blocks_and_are_known():
    """A ``runnable`` or ``fragment`` marker before anything else would exempt nothing, or
    a misspelt one would leave its snippet unchecked: both are mistakes."""
    wrong = [f"{s.where}: {s.marker} before a {s.lang or 'plain'} block" for s in ALL
             if s.marker in MARKERS and s.lang != "python"]
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            marker = MARKER.match(line.strip())
            if marker and marker.group(1) not in MARKERS:
                wrong.append(f"{page.relative_to(ROOT)}:{number}: unknown marker "
                             f"{marker.group(1)!r}")
    assert wrong == []


def test_the_docs_hold_runnable_snippets():
    """The runnable snippets are what keeps the docs' examples honest: at least two, so that
    losing the markers is noticed."""
    assert len(RUNNABLE) >= 2, [s.where for s in RUNNABLE]


@pytest.mark.parametrize("snippet", RUNNABLE, ids=lambda s: s.where)
def test_every_runnable_snippet_runs_without_spark_or_a_server(snippet, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(snippet.code)
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": path})
    assert done.returncode == 0, f"{snippet.where}:\n{done.stdout}\n{done.stderr}"


@pytest.mark.parametrize("snippet", SHELL_SNIPPETS, ids=lambda s: s.where)
def test_every_exactly_command_line_names_a_command_and_options_the_cli_has(snippet):
    problems = []
    for command in shell_commands(snippet):
        for args in exactly_invocations(command):
            problems += [f"{p}: {command!r}" for p in check_invocation(args)]
    assert problems == [], snippet.where


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_script_and_benchmark_a_page_names_exists(page):
    missing = sorted({path for path in NAMED_PATH.findall(page.read_text())
                      if not list(ROOT.glob(path.rstrip(".")))})
    assert missing == []


def test_the_command_check_sees_exactly_wherever_a_shell_line_runs_it():
    """The checker's own reading of shell lines: ``exactly`` after variables, pipes and in
    ``$(...)`` is found, an unknown flag or command is reported, and ``exactly`` as an
    argument is not taken for a command."""
    line = ("SPARK_REMOTE=sc://h:15002 exactly run job.py --checkpoint ck --no-such-flag && "
            "spark-submit $(exactly packages --kafka --submit) app.py | exactly nosuch")
    invocations = exactly_invocations(line)
    assert invocations == [["run", "job.py", "--checkpoint", "ck", "--no-such-flag"],
                           ["packages", "--kafka", "--submit"], ["nosuch"]]
    assert [check_invocation(args) for args in invocations] == [
        ["exactly run has no option --no-such-flag"], [], ["exactly has no command 'nosuch'"]]
    assert exactly_invocations("pip install exactly") == []
    assert check_invocation(["--verbose", "doctor", "ck", "[--sink-path", "OUT", "|",
                             "--sink-log", "DIR]", "[--json]"]) == []
    assert check_invocation(["verify", "--where", "-x > 0"]) == []  # a value, not a flag
    snippet = Snippet(ROOT / "README.md", 1, "console",
                      "$ exactly verify --input a \\\n    --expect \"select 1\n  from input\"\n"
                      "output line\n", None)
    assert shell_commands(snippet) == ['exactly verify --input a --expect "select 1\nfrom input"']
