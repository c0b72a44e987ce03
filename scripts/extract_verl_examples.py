"""The dotted overrides of verl's example scripts, as test data: ``tests/data/verl_examples.json``.

    python scripts/extract_verl_examples.py GIT_DIR [--ref v0.9.1] [--out tests/data/verl_examples.json]
                                            [--home /home/user] [--verl-root /home/user/verl]

GIT_DIR is a (bare) git directory of verl; REF the tag, branch or commit to read (``git show REF:examples/...``). For
every ``examples/**/*.sh`` that runs ``python -m verl.trainer.main_ppo`` (``python3``, ``"${LAUNCH[@]}"`` that
expands to ``uv run ... python3``, with or without ``"$@"``), the script is *interpreted, not run*: a small model of
bash evaluates the subset the examples use (assignments and arrays, ``+=``, ``${VAR:-default}`` and the other
parameter expansions, ``$((...))``, ``if``/``case``/``for``, ``[ ]``/``[[ ]]``/``(( ))``, line continuations, quotes,
word splitting of unquoted expansions) with an empty environment, as a user who sets no knob. No command of a script
is executed: ``python3 -c 'import torch_npu'`` fails (a GPU machine), ``date`` reads a fixed instant
(:data:`FIXED_NOW`), ``cd``/``pwd``/``dirname`` act on a virtual checkout at ``--verl-root``, ``$HOME`` is ``--home``
(fixed, so that the data does not depend on who extracts it), ``$@`` is empty; every other command does nothing,
and a command substitution that needs one of them is refused (the script is then listed with that reason).

A script that demands a variable (``${VAR:?...}``, or one unbound under ``set -u``) is interpreted again with that
variable set as a user would set it (:func:`stand_in`); ``env`` lists what was set.

Each entry: ``{"source", "commit", "recipe", "env", "overrides", "skipped"}``. ``recipe`` is ``kl_ppo`` when the run
uses a critic as verl 0.9.1 decides it (``critic.enable`` when given, else ``algorithm.adv_estimator`` is ``gae``,
verl's default) and ``grpo`` otherwise. ``overrides`` are the words after the module, in order, with ``--config-path`` /
``--config-name`` of verl's own ``ppo_trainer`` left out. ``skipped`` is null, or why the recipes cannot take the
script on a CPU machine for a reason outside the recipes (another Hydra primary config; an override that the
installed verl's own ``ppo_trainer`` tree refuses, so that ``python -m verl.trainer.main_ppo`` fails as well: a key
of another verl version than the installed one, a ``+key`` for a key verl already has, a config group of a plugin
package that is not installed).

The data in the repository was extracted from ``github:verl-project/verl`` (volcengine/verl moved there) at
1dda039b9c6311889a9c9a26040677e1254814f9 (main, 2026-08-22): the stored snapshot has no v0.9.1 tag and no commit
with version 0.9.1, and that commit's ``verl/`` is the closest of the snapshot's to the installed verl 0.9.1. Run it
again with ``--ref v0.9.1`` on a clone that has the tag.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import fnmatch
import importlib.util
import json
import posixpath
import re
import subprocess
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tests" / "data" / "verl_examples.json"
DEFAULT_HOME = "/home/user"
FIXED_NOW = _dt.datetime(2026, 1, 1, 0, 0, 0)
"""What ``date`` prints in the scripts (experiment names carry a time stamp)."""

LAUNCH_RE = re.compile(r"-m\s+verl\.trainer\.main_ppo(?![\w.])")
MODULE = "verl.trainer.main_ppo"
OWN_CONFIG_NAMES = ("ppo_trainer", "ppo_trainer.yaml")
"""``--config-name`` values that are main_ppo's own default (``@hydra.main(config_name="ppo_trainer")``)."""
KEPT_CONFIG_NAMES = ("ppo_megatron_trainer", "ppo_megatron_trainer.yaml")
"""``--config-name`` values the recipes take as typed (verl's ppo_trainer with model_engine=megatron,
``recipes.compose.compose.adopt_verl_primary``): kept in the overrides."""


class ShellError(Exception):
    """The model cannot evaluate this script; the message says which construct."""


class NeedsValue(Exception):
    """``${VAR:?message}`` (or an unbound variable under ``set -u``): the script needs a value from the user."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"needs {name} set ({message})")
        self.name = name


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _Break(Exception):
    pass


# -- the syntax tree --------------------------------------------------------------------------------------------------


@dataclass
class Word:
    parts: list  # ('lit', s) ('sq', s) ('dq', [parts]) ('param', ...) ('cmd', node) ('arith', Word)
    array: list | None = None  # NAME=( ... ): the element words
    text: str = ""  # the source text, for messages and reserved words

    def literal(self) -> str | None:
        """The word's text when it is one unquoted literal (a reserved word, a function name), else None."""
        if len(self.parts) == 1 and self.parts[0][0] == "lit":
            return self.parts[0][1]
        return None


@dataclass
class Simple:
    assigns: list  # (name, append, Word)
    words: list
    redirs: list  # (fd, op, Word | None)


@dataclass
class Pipeline:
    cmds: list
    negate: bool = False


@dataclass
class AndOr:
    first: Pipeline
    rest: list  # (op, Pipeline)


@dataclass
class Seq:
    items: list = field(default_factory=list)


@dataclass
class If:
    clauses: list  # (cond Seq, body Seq)
    orelse: Seq | None


@dataclass
class Case:
    word: Word
    arms: list  # ([pattern Word], body Seq)


@dataclass
class For:
    name: str
    words: list | None
    body: Seq


@dataclass
class While:
    cond: Seq
    body: Seq
    until: bool


@dataclass
class Group:
    body: Seq
    subshell: bool
    redirs: list = field(default_factory=list)


@dataclass
class ArithCmd:
    expr: Word


@dataclass
class CondCmd:
    tokens: list  # Word or operator strings


@dataclass
class FuncDef:
    name: str
    body: object


NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN_RE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?)=")
REDIR_RE = re.compile(r"(\d*)(&>>|&>|>>|>&|>\||<<<|<<-|<<|<&|<>|>|<)")
META = set(" \t\n;&|()<>")
BINARY_TESTS = ("=", "==", "!=", "<", ">", "-eq", "-ne", "-lt", "-le", "-gt", "-ge", "=~")


class Parser:
    """Recursive descent over the characters of a script, producing the tree above (bash's grammar, the part of it
    the examples use)."""

    def __init__(self, src: str) -> None:
        self.src = src
        self.pos = 0
        self.heredocs: list[tuple[str, bool]] = []

    # -- characters ---------------------------------------------------------------------------------------------------

    def peek(self, n: int = 1) -> str:
        return self.src[self.pos:self.pos + n]

    def at_end(self) -> bool:
        return self.pos >= len(self.src)

    def error(self, what: str) -> ShellError:
        line = self.src.count("\n", 0, self.pos) + 1
        return ShellError(f"line {line}: {what}")

    def skip_blanks(self) -> None:
        """Spaces, tabs, line continuations and a comment up to (not including) the end of its line."""
        while not self.at_end():
            c = self.peek()
            if c in " \t":
                self.pos += 1
            elif self.peek(2) == "\\\n":
                self.pos += 2
            elif c == "#":
                end = self.src.find("\n", self.pos)
                self.pos = len(self.src) if end < 0 else end
            else:
                break

    def newline(self) -> None:
        """Consume a newline and the bodies of the here-documents started on its line."""
        self.pos += 1
        for delim, strip in self.heredocs:
            while not self.at_end():
                end = self.src.find("\n", self.pos)
                end = len(self.src) if end < 0 else end
                line = self.src[self.pos:end]
                self.pos = min(end + 1, len(self.src))
                if (line.lstrip("\t") if strip else line) == delim:
                    break
        self.heredocs = []

    def skip_newlines(self) -> None:
        while True:
            self.skip_blanks()
            if self.peek() == "\n":
                self.newline()
            elif self.peek() == ";" and self.peek(2) != ";;":
                self.pos += 1
            else:
                return

    def next_word_text(self) -> str:
        """The literal text of the next word (for reserved words), without consuming it."""
        self.skip_blanks()
        m = re.match(r"[^\s;&|()<>'\"\\$`]+", self.src[self.pos:])
        if not m:
            return ""
        end = self.pos + m.end()
        if end < len(self.src) and self.src[end] not in META:
            return ""  # the word goes on with quotes or an expansion: not a reserved word
        return m.group(0)

    def expect_word(self, word: str) -> None:
        if self.next_word_text() != word:
            raise self.error(f"expected {word!r}, found {self.src[self.pos:self.pos + 20]!r}")
        self.pos += len(word)

    # -- lists --------------------------------------------------------------------------------------------------------

    def parse_seq(self, stop_words: set[str] = frozenset(), stop_chars: str = "") -> Seq:
        seq = Seq()
        while True:
            self.skip_newlines()
            if self.at_end():
                return seq
            if self.peek(2) == ";;" or (stop_chars and self.peek() in stop_chars):
                return seq
            if self.next_word_text() in stop_words:
                return seq
            seq.items.append(self.parse_and_or())
            self.skip_blanks()
            c = self.peek()
            if c == "&" and self.peek(2) != "&&":
                self.pos += 1  # a background job: run in order
            elif c == ";" and self.peek(2) != ";;":
                self.pos += 1
            elif c == "\n":
                self.newline()

    def parse_and_or(self) -> AndOr:
        first = self.parse_pipeline()
        rest = []
        while True:
            self.skip_blanks()
            op = self.peek(2)
            if op not in ("&&", "||"):
                return AndOr(first, rest)
            self.pos += 2
            self.skip_newlines()
            rest.append((op, self.parse_pipeline()))

    def parse_pipeline(self) -> Pipeline:
        negate = False
        if self.next_word_text() == "!":
            self.pos += 1
            negate = True
        cmds = [self.parse_command()]
        while True:
            self.skip_blanks()
            if self.peek() == "|" and self.peek(2) != "||":
                self.pos += 2 if self.peek(2) == "|&" else 1
                self.skip_newlines()
                cmds.append(self.parse_command())
            else:
                return Pipeline(cmds, negate)

    # -- commands -----------------------------------------------------------------------------------------------------

    def parse_command(self):
        self.skip_blanks()
        word = self.next_word_text()
        if word == "if":
            return self.parse_if()
        if word == "case":
            return self.parse_case()
        if word == "for":
            return self.parse_for()
        if word in ("while", "until"):
            self.pos += len(word)
            cond = self.parse_seq({"do"})
            self.expect_word("do")
            body = self.parse_seq({"done"})
            self.expect_word("done")
            return While(cond, body, word == "until")
        if word == "{":
            self.pos += 1
            body = self.parse_seq({"}"})
            self.expect_word("}")
            return Group(body, False, self.parse_redirs())
        if word == "function":
            self.pos += len(word)
            name = self.next_word_text()
            self.pos += len(name)
            self.skip_blanks()
            if self.peek(2) == "()":
                self.pos += 2
            self.skip_newlines()
            return FuncDef(name, self.parse_command())
        if word == "[[":
            self.pos += 2
            return self.parse_cond()
        if self.peek(2) == "((":
            self.pos += 2
            return ArithCmd(self.parse_arith_text("))"))
        if self.peek() == "(":
            self.pos += 1
            body = self.parse_seq(stop_chars=")")
            if self.peek() != ")":
                raise self.error("unterminated subshell")
            self.pos += 1
            return Group(body, True, self.parse_redirs())
        if word and NAME_RE.fullmatch(word) and re.match(r"\s*\(\)", self.src[self.pos + len(word):]):
            self.pos += len(word)
            self.skip_blanks()
            self.pos += 2
            self.skip_newlines()
            return FuncDef(word, self.parse_command())
        return self.parse_simple()

    def parse_redirs(self) -> list:
        redirs = []
        while True:
            self.skip_blanks()
            r = self.try_redir()
            if r is None:
                return redirs
            redirs.append(r)

    def try_redir(self):
        m = REDIR_RE.match(self.src, self.pos)
        if not m:
            return None
        fd, op = m.group(1), m.group(2)
        self.pos = m.end()
        self.skip_blanks()
        if op in ("<<", "<<-"):
            target = self.parse_word()
            delim = "".join(p[1] if p[0] in ("lit", "sq") else "".join(q[1] for q in p[1]) for p in target.parts)
            self.heredocs.append((delim, op == "<<-"))
            return (fd, op, target)
        if op in (">&", "<&") and re.match(r"\d|-", self.peek()):
            target = Word([("lit", self.peek())], text=self.peek())
            self.pos += 1
            return (fd, op, target)
        return (fd, op, self.parse_word())

    def parse_simple(self) -> Simple:
        assigns, words, redirs = [], [], []
        while True:
            self.skip_blanks()
            r = self.try_redir()
            if r is not None:
                redirs.append(r)
                continue
            if self.at_end() or self.peek() in "\n;&|)" or self.peek(2) == ";;":
                break
            if self.peek() == "(":
                raise self.error("unexpected '('")
            start = self.pos
            w = self.parse_word(allow_array=True)
            m = ASSIGN_RE.match(self.src, start)
            is_assign = m is not None and (w.array is not None or m.end() <= self.pos)
            declaring = words and words[0].literal() in ("export", "declare", "typeset", "local", "readonly")
            if is_assign and (not words or declaring):
                name, index, append = m.group(1), m.group(2), m.group(3) == "+"
                if index:
                    raise self.error(f"array element assignment {m.group(0)!r}")
                value = w if w.array is not None else Parser.word_from(self.src[m.end():self.pos])
                if words:
                    words.append(Word([("assign", name, append, value)], text=w.text))
                else:
                    assigns.append((name, append, value))
            elif w.array is not None:
                raise self.error("array literal outside an assignment")
            else:
                words.append(w)
        return Simple(assigns, words, redirs)

    @staticmethod
    def word_from(text: str) -> Word:
        p = Parser(text)
        if not text:
            return Word([], text="")
        return p.parse_word(stop_at_meta=False)

    def parse_if(self) -> If:
        self.expect_word("if")
        clauses = []
        cond = self.parse_seq({"then"})
        self.expect_word("then")
        body = self.parse_seq({"elif", "else", "fi"})
        clauses.append((cond, body))
        orelse = None
        while True:
            w = self.next_word_text()
            if w == "elif":
                self.pos += 4
                cond = self.parse_seq({"then"})
                self.expect_word("then")
                body = self.parse_seq({"elif", "else", "fi"})
                clauses.append((cond, body))
            elif w == "else":
                self.pos += 4
                orelse = self.parse_seq({"fi"})
            else:
                self.expect_word("fi")
                return If(clauses, orelse)

    def parse_case(self) -> Case:
        self.expect_word("case")
        self.skip_blanks()
        word = self.parse_word()
        self.skip_newlines()
        self.expect_word("in")
        arms = []
        while True:
            self.skip_newlines()
            if self.next_word_text() == "esac":
                self.pos += 4
                return Case(word, arms)
            if self.peek() == "(":
                self.pos += 1
            patterns = []
            while True:
                self.skip_blanks()
                patterns.append(self.parse_word())
                self.skip_blanks()
                c = self.peek()
                self.pos += 1
                if c == ")":
                    break
                if c != "|":
                    raise self.error("bad case pattern")
            body = self.parse_seq({"esac"})
            if self.peek(2) == ";;":
                self.pos += 2
                if self.peek() == "&":
                    raise self.error("';;&' in case")
            arms.append((patterns, body))

    def parse_for(self) -> For:
        self.expect_word("for")
        self.skip_blanks()
        if self.peek(2) == "((":
            raise self.error("arithmetic for loop")
        name = self.next_word_text()
        self.pos += len(name)
        self.skip_blanks()
        words = None
        if self.next_word_text() == "in":
            self.pos += 2
            words = []
            while True:
                self.skip_blanks()
                if self.peek() in ";\n":
                    break
                words.append(self.parse_word())
        self.skip_newlines()
        self.expect_word("do")
        body = self.parse_seq({"done"})
        self.expect_word("done")
        return For(name, words, body)

    def parse_cond(self) -> CondCmd:
        tokens = []
        while True:
            self.skip_blanks()
            if self.peek() == "\n":
                self.newline()
                continue
            after = self.src[self.pos + 2:self.pos + 3]
            if self.src.startswith("]]", self.pos) and (not after or after in META):
                self.pos += 2
                return CondCmd(tokens)
            for op in ("&&", "||", "(", ")", "<", ">"):
                if self.src.startswith(op, self.pos):
                    tokens.append(op)
                    self.pos += len(op)
                    break
            else:
                if self.at_end():
                    raise self.error("unterminated [[")
                tokens.append(self.parse_word())

    def parse_arith_text(self, closer: str) -> Word:
        """The text up to the ``))`` that closes ``((`` / ``$((``, as a word whose expansions (``$x``) are made."""
        depth, i = 0, self.pos
        while i < len(self.src):
            c = self.src[i]
            if c == "(":
                depth += 1
            elif c == ")":
                if depth == 0 and self.src.startswith(closer, i):
                    text = self.src[self.pos:i]
                    self.pos = i + len(closer)
                    return Word(Parser(text).parse_dq_parts(end=None), text=text)
                depth -= 1
            i += 1
        raise self.error("unterminated arithmetic")

    # -- words --------------------------------------------------------------------------------------------------------

    def parse_word(self, allow_array: bool = False, stop_at_meta: bool = True, stop_char: str = "") -> Word:
        start = self.pos
        parts: list = []
        lit = []

        def flush() -> None:
            if lit:
                parts.append(("lit", "".join(lit)))
                lit.clear()

        while not self.at_end():
            c = self.peek()
            if stop_char and c == stop_char:
                break
            if stop_at_meta and c in META:
                if c == "(" and allow_array and not parts and ASSIGN_RE.fullmatch("".join(lit)):
                    flush()
                    self.pos += 1
                    return Word(parts, array=self.parse_array(), text=self.src[start:self.pos])
                break
            if c == "\\":
                nxt = self.src[self.pos + 1:self.pos + 2]
                self.pos += 2
                if nxt != "\n":
                    flush()
                    parts.append(("sq", nxt))
            elif c == "'":
                flush()
                end = self.src.find("'", self.pos + 1)
                if end < 0:
                    raise self.error("unterminated '")
                parts.append(("sq", self.src[self.pos + 1:end]))
                self.pos = end + 1
            elif c == '"':
                flush()
                self.pos += 1
                parts.append(("dq", self.parse_dq_parts(end='"')))
            elif c == "$" and self.src[self.pos + 1:self.pos + 2] == "'":
                flush()
                end = self.src.find("'", self.pos + 2)
                parts.append(("sq", self.src[self.pos + 2:end].encode().decode("unicode_escape")))
                self.pos = end + 1
            elif c == "$":
                flush()
                parts.append(self.parse_dollar())
            elif c == "`":
                raise self.error("backquoted command substitution")
            else:
                lit.append(c)
                self.pos += 1
        flush()
        return Word(parts, text=self.src[start:self.pos])

    def parse_array(self) -> list:
        words = []
        while True:
            self.skip_blanks()
            c = self.peek()
            if c == "\n":
                self.newline()
            elif c == ")":
                self.pos += 1
                return words
            elif self.at_end():
                raise self.error("unterminated array")
            else:
                words.append(self.parse_word())

    def parse_dq_parts(self, end: str | None) -> list:
        """Inside double quotes (``end='"'``), or a whole text with expansions and no quoting (``end=None``)."""
        parts, lit = [], []
        while True:
            if self.at_end():
                if end is not None:
                    raise self.error('unterminated "')
                break
            c = self.peek()
            if end is not None and c == end:
                self.pos += 1
                break
            if c == "\\" and end is not None:
                nxt = self.src[self.pos + 1:self.pos + 2]
                self.pos += 2
                if nxt == "\n":
                    continue
                lit.append(nxt if nxt in '$`"\\' else "\\" + nxt)
            elif c == "$" and re.match(r"[{(A-Za-z_0-9@*#?$!-]", self.src[self.pos + 1:self.pos + 2] or " "):
                if lit:
                    parts.append(("lit", "".join(lit)))
                    lit = []
                parts.append(self.parse_dollar())
            elif c == "`":
                raise self.error("backquoted command substitution")
            else:
                lit.append(c)
                self.pos += 1
        if lit:
            parts.append(("lit", "".join(lit)))
        return parts

    def parse_dollar(self):
        assert self.peek() == "$"
        self.pos += 1
        c = self.peek()
        if self.peek(2) == "((":
            self.pos += 2
            return ("arith", self.parse_arith_text("))"))
        if c == "(":
            self.pos += 1
            body = self.parse_seq(stop_chars=")")
            if self.peek() != ")":
                raise self.error("unterminated $(")
            self.pos += 1
            return ("cmd", body)
        if c == "{":
            self.pos += 1
            return self.parse_braced()
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?$!-]", self.src[self.pos:])
        if not m:
            return ("lit", "$")
        self.pos += m.end()
        return ("param", m.group(0), None, "", None, False)

    def parse_braced(self):
        """``${...}`` after the brace: ('param', name, index, op, arg Word | None, length)."""
        length = False
        if self.peek() == "#" and self.src[self.pos + 1:self.pos + 2] not in ("}", ""):
            length = True
            self.pos += 1
        if self.peek() == "!":
            raise self.error("indirect expansion ${!...}")
        m = re.match(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[@*#?$!-]", self.src[self.pos:])
        if not m:
            raise self.error("bad ${...}")
        name = m.group(0)
        self.pos += m.end()
        index = None
        if self.peek() == "[":
            end = self.src.index("]", self.pos)
            index = self.src[self.pos + 1:end]
            self.pos = end + 1
        if self.peek() == "}":
            self.pos += 1
            return ("param", name, index, "", None, length)
        m = re.match(r":-|:=|:\+|:\?|##|%%|//|\^\^|,,|[-=+?#%/^,:]", self.src[self.pos:])
        if not m or length:
            raise self.error(f"bad ${{{name}...}}")
        op = m.group(0)
        self.pos += m.end()
        arg = self.parse_braced_arg()
        return ("param", name, index, op, arg, False)

    def parse_braced_arg(self) -> Word:
        """The word after the operator of ``${name<op>word}``, up to the closing brace."""
        parts, lit, depth = [], [], 0
        while True:
            if self.at_end():
                raise self.error("unterminated ${")
            c = self.peek()
            if c == "}" and depth == 0:
                self.pos += 1
                break
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
            if c in "'\"$\\":
                if lit:
                    parts.append(("lit", "".join(lit)))
                    lit = []
                sub = self.parse_word(stop_at_meta=False, stop_char="}")
                parts.extend(sub.parts)
                continue
            lit.append(c)
            self.pos += 1
        if lit:
            parts.append(("lit", "".join(lit)))
        return Word(parts)


# -- evaluation -------------------------------------------------------------------------------------------------------


class _Fields:
    """The fields a word expands to: quoted text joins a field, unquoted expansions split on blanks."""

    def __init__(self) -> None:
        self.done: list[str] = []
        self.cur: list | None = None

    def add(self, text: str, quoted: bool) -> None:
        if self.cur is None:
            self.cur = ["", False]
        self.cur[0] += text
        self.cur[1] = self.cur[1] or quoted

    def brk(self) -> None:
        if self.cur is not None and (self.cur[0] or self.cur[1]):
            self.done.append(self.cur[0])
        self.cur = None

    def split_add(self, value: str) -> None:
        if not value:
            return
        if value[0] in " \t\n":
            self.brk()
        for i, piece in enumerate(p for p in re.split(r"[ \t\n]+", value) if p):
            if i:
                self.brk()
            self.add(piece, False)
        if value[-1] in " \t\n":
            self.brk()

    def result(self) -> list[str]:
        self.brk()
        return self.done


@dataclass
class Launch:
    argv: list[str]
    line: str


class Shell:
    """Evaluates a parsed script without running any command (see the module docstring)."""

    def __init__(self, script_path: str, home: str, verl_root: str) -> None:
        self.vars: dict[str, str | list[str]] = {"HOME": home, "PWD": verl_root, "IFS": " \t\n", "USER": "user"}
        self.script_path = script_path
        self.cwd = verl_root
        self.positional: list[str] = []
        self.status = 0
        self.nounset = False
        self.functions: dict[str, object] = {}
        self.out: list[list[str]] = []
        self.launches: list[Launch] = []
        self.others: list[str] = []  # the other commands met, in order (for a report)

    # -- values -------------------------------------------------------------------------------------------------------

    def get(self, name: str, index: str | None):
        """(value: str | list | None (unset), is_array_all)."""
        if name in ("@", "*"):
            return list(self.positional), True
        if name == "#":
            return str(len(self.positional)), False
        if name == "?":
            return str(self.status), False
        if name == "$":
            return "4242", False
        if name == "0":
            return self.script_path, False
        if name.isdigit():
            i = int(name)
            return (self.positional[i - 1] if i <= len(self.positional) else None), False
        if name == "BASH_SOURCE":
            value: str | list[str] | None = [self.script_path]
        else:
            value = self.vars.get(name)
        if index in ("@", "*"):
            if value is None:
                return [], True
            return (list(value) if isinstance(value, list) else [value]), True
        if isinstance(value, list):
            i = self.arith(index) if index not in (None, "") else 0
            return (value[i] if 0 <= i < len(value) else None), False
        if index not in (None, "", "0"):
            return None, False
        return value, False

    def param(self, part, fields: _Fields | None, quoted: bool) -> str | list[str]:
        _, name, index, op, arg, length = part
        value, all_elems = self.get(name, index)
        if length:
            return str(len(value)) if all_elems else str(len(value or ""))
        is_set = value is not None and not (all_elems and not value)
        empty = not is_set or value == "" or (all_elems and value == [""])
        if op == ":-":
            return self.expand_str(arg) if empty else value
        if op == "-":
            return self.expand_str(arg) if not is_set else value
        if op in (":=", "="):
            if empty if op == ":=" else not is_set:
                self.vars[name] = self.expand_str(arg)
                return self.vars[name]
            return value
        if op == ":+":
            return "" if empty else self.expand_str(arg)
        if op == "+":
            return "" if not is_set else self.expand_str(arg)
        if op in (":?", "?"):
            if empty if op == ":?" else not is_set:
                raise NeedsValue(name, self.expand_str(arg) or "parameter null or not set")
            return value
        if not is_set:
            if self.nounset and not all_elems and name not in ("@", "*"):
                raise NeedsValue(name, "unbound variable under set -u")
            return [] if all_elems else ""
        if op == "":
            return value
        if all_elems:
            return [self._transform(v, op, arg) for v in value]
        return self._transform(value, op, arg)

    def _transform(self, value: str, op: str, arg: Word) -> str:
        pattern = self.expand_str(arg)
        if op in ("#", "##", "%", "%%"):
            rx = fnmatch.translate(pattern)[4:-3]  # the body of (?s:...)\Z
            if not op.startswith("#"):
                candidates = range(len(value) + 1) if op == "%%" else range(len(value), -1, -1)
                for i in candidates:
                    if re.fullmatch(rx, value[i:], re.S):
                        return value[:i]
                return value
            candidates = range(len(value), -1, -1) if op == "##" else range(len(value) + 1)
            for i in candidates:
                if re.fullmatch(rx, value[:i], re.S):
                    return value[i:]
            return value
        if op in ("/", "//"):
            pat, _, rep = pattern.partition("/")
            return value.replace(pat, rep) if op == "//" else value.replace(pat, rep, 1)
        if op == "^^":
            return value.upper()
        if op == ",,":
            return value.lower()
        raise ShellError(f"${{...{op}...}} is not modelled")

    def expand(self, word: Word) -> list[str]:
        """The fields of ``word``."""
        fields = _Fields()
        for i, part in enumerate(word.parts):
            self._expand_part(part, fields, quoted=False, first=(i == 0))
        return fields.result()

    def expand_str(self, word: Word | None) -> str:
        """``word`` as one string, without splitting (an assignment's value, a case word, an operator's argument)."""
        if word is None:
            return ""
        fields = _Fields()
        for i, part in enumerate(word.parts):
            self._expand_part(part, fields, quoted=True, first=(i == 0))
        return " ".join(fields.result())

    def _expand_part(self, part, fields: _Fields, quoted: bool, first: bool) -> None:
        kind = part[0]
        if kind == "lit":
            text = part[1]
            if first and (text == "~" or text.startswith("~/")) and not quoted:
                text = self.vars["HOME"] + text[1:]
            if not quoted and re.search(r"\{[^{}]*,[^{}]*\}", text):
                raise ShellError(f"brace expansion in {text!r}")
            fields.add(text, quoted)
        elif kind == "sq":
            fields.add(part[1], True)
        elif kind == "dq":
            if not all(sub[0] == "param" and (sub[1] in ("@", "*") or sub[2] in ("@", "*")) for sub in part[1]) \
                    or not part[1]:
                fields.add("", True)  # "" is an empty field; "${A[@]}" of an empty array is none
            for sub in part[1]:
                self._expand_part(sub, fields, quoted=True, first=False)
        elif kind == "assign":
            _, name, append, value = part
            fields.add(f"{name}{'+' if append else ''}={self.expand_str(value)}", True)
        else:
            if kind == "param":
                value = self.param(part, fields, quoted)
            elif kind == "cmd":
                value = self.substitute(part[1])
            elif kind == "arith":
                value = str(self.arith(self.expand_str(part[1])))
            else:
                raise ShellError(f"unknown part {kind}")
            if isinstance(value, list):
                for i, v in enumerate(value):
                    if i:
                        fields.brk()
                    fields.add(v, True) if quoted else fields.split_add(v)
            elif quoted:
                fields.add(value, True)
            else:
                fields.split_add(value)

    def substitute(self, body: Seq) -> str:
        saved = (dict(self.vars), self.cwd, self.nounset, self.status)
        self.out.append([])
        try:
            self.run_seq(body, in_subst=True)
        except _Exit as done:
            self.status = done.code
        finally:
            text = "".join(self.out.pop())
            self.vars, self.cwd, self.nounset, status = saved
        return text.rstrip("\n")

    # -- arithmetic ---------------------------------------------------------------------------------------------------

    def arith(self, text: str) -> int:
        tokens = re.findall(
            r"0[xX][0-9a-fA-F]+|\d+|[A-Za-z_][A-Za-z0-9_]*|\*\*|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%<>!~&|^()?:]|\S", text)
        pos = 0

        def peek():
            return tokens[pos] if pos < len(tokens) else None

        def take():
            nonlocal pos
            pos += 1
            return tokens[pos - 1]

        binary = [("||",), ("&&",), ("|",), ("^",), ("&",), ("==", "!="), ("<", ">", "<=", ">="), ("<<", ">>"),
                  ("+", "-"), ("*", "/", "%"), ("**",)]

        def value_of(name: str, depth: int = 0) -> int:
            v = self.vars.get(name, "")
            v = v[0] if isinstance(v, list) else v
            v = v.strip()
            if not v:
                return 0
            if re.fullmatch(r"-?\d+", v):
                return int(v)
            if depth > 8:
                raise ShellError(f"arithmetic: {name} recurses")
            return self.arith(v)

        def unary():
            t = peek()
            if t in ("-", "+", "!", "~"):
                take()
                v = unary()
                return {"-": -v, "+": v, "!": int(not v), "~": ~v}[t]
            if t == "(":
                take()
                v = ternary()
                if take() != ")":
                    raise ShellError(f"arithmetic: bad {text!r}")
                return v
            t = take() if t is not None else None
            if t is None:
                raise ShellError(f"arithmetic: bad {text!r}")
            if t.isdigit():
                return int(t)
            if t.lower().startswith("0x"):
                return int(t, 16)
            if NAME_RE.fullmatch(t):
                return value_of(t)
            raise ShellError(f"arithmetic: {t!r} in {text!r}")

        def level(i: int):
            if i == len(binary):
                return unary()
            left = level(i + 1)
            while peek() in binary[i]:
                op = take()
                right = level(i + 1) if op != "**" else level(i)
                if op in ("/", "%") and right == 0:
                    raise ShellError(f"arithmetic: division by zero in {text!r}")
                if op == "/":
                    left = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)
                elif op == "%":
                    left = abs(left) % abs(right) * (1 if left >= 0 else -1)
                else:
                    left = {
                        "||": lambda a, b: int(bool(a or b)), "&&": lambda a, b: int(bool(a and b)),
                        "|": lambda a, b: a | b, "^": lambda a, b: a ^ b, "&": lambda a, b: a & b,
                        "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b),
                        "<": lambda a, b: int(a < b), ">": lambda a, b: int(a > b),
                        "<=": lambda a, b: int(a <= b), ">=": lambda a, b: int(a >= b),
                        "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b,
                        "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
                        "**": lambda a, b: a ** b,
                    }[op](left, right)
            return left

        def ternary():
            cond = level(0)
            if peek() == "?":
                take()
                a = ternary()
                if take() != ":":
                    raise ShellError(f"arithmetic: bad {text!r}")
                b = ternary()
                return a if cond else b
            return cond

        if not tokens:
            return 0
        result = ternary()
        if pos != len(tokens):
            raise ShellError(f"arithmetic: cannot evaluate {text!r}")
        return result

    # -- tests --------------------------------------------------------------------------------------------------------

    def test(self, args: list[str], extended: bool = False, quoted_rhs: list[bool] | None = None) -> bool:
        pos = 0

        def peek(k: int = 0):
            return args[pos + k] if pos + k < len(args) else None

        def primary() -> bool:
            nonlocal pos
            t = peek()
            if t == "!" and peek(1) is not None:
                pos += 1
                return not primary()
            if t == "(":
                pos += 1
                v = expr()
                pos += 1
                return v
            if peek(1) in BINARY_TESTS and peek(2) is not None:
                left, op, right = args[pos], args[pos + 1], args[pos + 2]
                pos += 3
                if op in ("=", "==", "!="):
                    same = fnmatch.fnmatchcase(left, right) if extended and not (quoted_rhs or {}).get(pos - 1) \
                        else left == right
                    return same if op != "!=" else not same
                if op == "=~":
                    return re.search(right, left) is not None
                if op in ("<", ">"):
                    return left < right if op == "<" else left > right
                a, b = self.arith(left), self.arith(right)
                return {"-eq": a == b, "-ne": a != b, "-lt": a < b, "-le": a <= b, "-gt": a > b, "-ge": a >= b}[op]
            if t in ("-n", "-z") and peek(1) is not None:
                pos += 2
                return bool(args[pos - 1]) if t == "-n" else not args[pos - 1]
            if t in ("-e", "-f", "-d", "-s", "-r", "-w", "-x", "-L", "-h") and peek(1) is not None:
                pos += 2
                self.others.append(f"test {t} {args[pos - 1]} (false: no file exists here)")
                return False
            if t is None:
                return False
            pos += 1
            return bool(t)

        def conj() -> bool:
            nonlocal pos
            v = primary()
            while peek() in ("-a", "&&"):
                pos += 1
                w = primary()
                v = v and w
            return v

        def expr() -> bool:
            nonlocal pos
            v = conj()
            while peek() in ("-o", "||"):
                pos += 1
                w = conj()
                v = v or w
            return v

        return expr()

    # -- commands -----------------------------------------------------------------------------------------------------

    def run_seq(self, seq: Seq, in_subst: bool = False) -> int:
        for item in seq.items:
            self.run_and_or(item, in_subst)
        return self.status

    def run_and_or(self, node: AndOr, in_subst: bool) -> int:
        status = self.run_pipeline(node.first, in_subst)
        for op, pipe in node.rest:
            if (op == "&&" and status == 0) or (op == "||" and status != 0):
                status = self.run_pipeline(pipe, in_subst)
        return status

    def run_pipeline(self, node: Pipeline, in_subst: bool) -> int:
        for cmd in node.cmds[:-1]:
            self.out.append([])
            try:
                self.run_command(cmd, in_subst)
            finally:
                self.out.pop()
        status = self.run_command(node.cmds[-1], in_subst)
        if node.negate:
            status = int(not status)
        self.status = status
        return status

    def run_command(self, node, in_subst: bool) -> int:
        if isinstance(node, Simple):
            status = self.run_simple(node, in_subst)
        elif isinstance(node, If):
            status = 0
            for cond, body in node.clauses:
                if self.run_seq(cond, in_subst) == 0:
                    status = self.run_seq(body, in_subst)
                    break
            else:
                if node.orelse is not None:
                    status = self.run_seq(node.orelse, in_subst)
        elif isinstance(node, Case):
            word = self.expand_str(node.word)
            status = 0
            for patterns, body in node.arms:
                if any(fnmatch.fnmatchcase(word, self.expand_str(p)) for p in patterns):
                    status = self.run_seq(body, in_subst)
                    break
        elif isinstance(node, For):
            items = self.positional if node.words is None else [f for w in node.words for f in self.expand(w)]
            status = 0
            for item in items:
                self.vars[node.name] = item
                status = self.run_seq(node.body, in_subst)
        elif isinstance(node, While):
            status = 0
            for _ in range(1000):
                if (self.run_seq(node.cond, in_subst) == 0) == node.until:
                    break
                status = self.run_seq(node.body, in_subst)
            else:
                raise ShellError("a while loop that does not end")
        elif isinstance(node, Group):
            if node.subshell:
                saved = (dict(self.vars), self.cwd, self.nounset)
                try:
                    status = self.run_seq(node.body, in_subst)
                except _Exit as done:
                    status = done.code
                self.vars, self.cwd, self.nounset = saved
            else:
                status = self.run_seq(node.body, in_subst)
        elif isinstance(node, ArithCmd):
            status = int(self.arith(self.expand_str(node.expr)) == 0)
        elif isinstance(node, CondCmd):
            args, quoted = [], {}
            for t in node.tokens:
                if isinstance(t, str):
                    args.append(t)
                else:
                    quoted[len(args)] = any(p[0] in ("sq", "dq") for p in t.parts)
                    args.append(self.expand_str(t))
            status = int(not self.test(args, extended=True, quoted_rhs=quoted))
        elif isinstance(node, FuncDef):
            self.functions[node.name] = node.body
            status = 0
        else:
            raise ShellError(f"unknown node {type(node).__name__}")
        self.status = status
        return status

    def assign(self, name: str, append: bool, value: Word) -> None:
        if value.array is not None:
            elems = [f for w in value.array for f in self.expand(w)]
            if append:
                old = self.vars.get(name)
                old = [] if old is None else (old if isinstance(old, list) else [old])
                elems = old + elems
            self.vars[name] = elems
            return
        text = self.expand_str(value)
        if append:
            old = self.vars.get(name, "")
            if isinstance(old, list):
                self.vars[name] = old + [text]
                return
            text = old + text
        self.vars[name] = text

    def run_simple(self, node: Simple, in_subst: bool) -> int:
        argv = [f for w in node.words for f in self.expand(w)]
        if not argv:
            for name, append, value in node.assigns:
                self.assign(name, append, value)
            return 0
        silent = any(fd in ("", "1") and op in (">", ">>", ">|", "&>", "&>>") or
                     (op == ">&" and fd in ("", "1") and self.expand_str(t) != "1") for fd, op, t in node.redirs)
        return self.builtin(argv, in_subst, silent)

    def echo(self, text: str, silent: bool) -> None:
        if not silent and self.out:
            self.out[-1].append(text)

    def builtin(self, argv: list[str], in_subst: bool, silent: bool) -> int:
        cmd = argv[0]
        base = posixpath.basename(cmd)
        if any(posixpath.basename(a) in ("python", "python3") for a in argv) and MODULE in argv:
            i = argv.index(MODULE)
            if argv[i - 1] == "-m" and posixpath.basename(argv[i - 2]) in ("python", "python3"):
                self.launches.append(Launch(argv[i + 1:], " ".join(argv[:i + 1])))
                return 0
        if cmd in ("export", "declare", "typeset", "local", "readonly"):
            for arg in argv[1:]:
                if arg.startswith(("-", "+")):
                    if "a" in arg or "A" in arg:
                        raise ShellError(f"{cmd} {arg}")
                    continue
                m = ASSIGN_RE.match(arg)
                if m:
                    old = self.vars.get(m.group(1), "") if m.group(3) else ""
                    self.vars[m.group(1)] = (old if isinstance(old, str) else " ".join(old)) + arg[m.end():]
            return 0
        if cmd == "unset":
            for arg in argv[1:]:
                if not arg.startswith("-"):
                    self.vars.pop(arg, None)
            return 0
        if cmd == "set":
            args = argv[1:]
            if "--" in args:
                self.positional = args[args.index("--") + 1:]
                args = args[:args.index("--")]
            for k, arg in enumerate(args):
                if arg.startswith("-") and "u" in arg and not arg.startswith("-o"):
                    self.nounset = True
                if arg.startswith("+") and "u" in arg:
                    self.nounset = False
                if arg in ("-o", "+o") and k + 1 < len(args) and args[k + 1] == "nounset":
                    self.nounset = arg == "-o"
            return 0
        if cmd == "shift":
            n = int(argv[1]) if len(argv) > 1 else 1
            self.positional = self.positional[n:]
            return 0
        if cmd == "exit":
            raise _Exit(int(argv[1]) if len(argv) > 1 and argv[1].lstrip("-").isdigit() else self.status)
        if cmd in ("source", ".", "eval", "exec"):
            raise ShellError(f"{cmd} {' '.join(argv[1:])}: not modelled")
        if cmd in (":", "true"):
            return 0
        if cmd == "false":
            return 1
        if cmd in ("[", "test"):
            args = argv[1:-1] if cmd == "[" else argv[1:]
            return int(not self.test(args))
        if cmd == "echo":
            args = argv[1:]
            newline = True
            while args and re.fullmatch(r"-[neE]+", args[0]):
                newline = newline and "n" not in args[0]
                args = args[1:]
            self.echo(" ".join(args) + ("\n" if newline else ""), silent)
            return 0
        if cmd == "printf":
            fmt, args = (argv[1] if len(argv) > 1 else ""), argv[2:]
            if "%" in fmt.replace("%%", ""):
                raise ShellError(f"printf {fmt!r}: not modelled")
            self.echo(fmt.replace("%%", "%").encode().decode("unicode_escape"), silent)
            return 0
        if cmd == "cd":
            args = [a for a in argv[1:] if a != "--"]
            target = args[0] if args else self.vars["HOME"]
            self.cwd = posixpath.normpath(posixpath.join(self.cwd, target))
            return 0
        if cmd == "pwd":
            self.echo(self.cwd + "\n", silent)
            return 0
        if cmd == "dirname":
            self.echo((posixpath.dirname(argv[1].rstrip("/")) or ".") + "\n", silent)
            return 0
        if cmd == "basename":
            self.echo(posixpath.basename(argv[1].rstrip("/")) + "\n", silent)
            return 0
        if cmd == "date":
            fmt = next((a[1:] for a in argv[1:] if a.startswith("+")), None)
            if fmt is None or len(argv) != 2:
                raise ShellError(f"{' '.join(argv)}: not modelled")
            self.echo(FIXED_NOW.strftime(fmt) + "\n", silent)
            return 0
        if cmd in self.functions:
            saved = self.positional
            self.positional = argv[1:]
            try:
                return self.run_command(self.functions[cmd], in_subst)
            finally:
                self.positional = saved
        if base in ("python", "python3") and "-c" in argv:
            return 1  # the torch_npu probe: not an Ascend machine
        if in_subst and not silent:
            raise ShellError(f"$({' '.join(argv)}): a command substitution that needs a command's output")
        self.others.append(" ".join(argv))
        return 0


# -- the scripts ------------------------------------------------------------------------------------------------------


@dataclass
class Example:
    source: str
    commit: str
    recipe: str
    overrides: list[str]
    skipped: str | None
    env: dict[str, str] = field(default_factory=dict)

    def as_json(self) -> dict:
        return {"source": self.source, "commit": self.commit, "recipe": self.recipe, "env": self.env,
                "overrides": self.overrides, "skipped": self.skipped}


def interpret(text: str, source: str, home: str, verl_root: str, env: dict[str, str] | None = None) -> Shell:
    """Evaluate the script ``text`` (its path in verl: ``source``) with the variables ``env`` set beforehand;
    raises ShellError / NeedsValue."""
    tree = Parser(text).parse_seq()
    shell = Shell(posixpath.join(verl_root, source), home, verl_root)
    shell.vars.update(env or {})
    try:
        shell.run_seq(tree)
    except _Exit:
        pass
    return shell


def recipe_of(overrides: list[str]) -> str:
    """``kl_ppo`` when the run uses a critic as verl 0.9.1 decides (``need_critic``): ``critic.enable`` when given,
    else ``algorithm.adv_estimator`` (verl's default: ``gae``) is ``gae``; ``grpo`` otherwise."""
    values = {}
    for arg in overrides:
        key, sep, value = arg.lstrip("+").partition("=")
        if sep:
            values[key] = value.strip("'\"")
    enable = values.get("critic.enable")
    if enable is not None and enable.lower() not in ("null", "none", "~"):
        return "kl_ppo" if enable.lower() == "true" else "grpo"
    return "kl_ppo" if values.get("algorithm.adv_estimator", "gae") == "gae" else "grpo"


def split_hydra_flags(args: list[str]) -> tuple[list[str], str | None]:
    """(the overrides, why the script is skipped or None): ``--config-path``/``--config-name`` of main_ppo's own
    ``ppo_trainer`` are dropped; another config name, or any other flag, is a reason to skip."""
    overrides, reason = [], None
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("-"):
            flag, sep, value = arg.partition("=")
            if not sep and flag in ("--config-path", "--config-name", "-cp", "-cn") and i + 1 < len(args):
                i += 1
                value = args[i]
            if flag in ("--config-name", "-cn"):
                if value in KEPT_CONFIG_NAMES:
                    overrides.append(f"--config-name={value}")
                elif value not in OWN_CONFIG_NAMES:
                    reason = (f"--config-name={value}: composes another Hydra primary config than main_ppo's "
                              "ppo_trainer, which the recipes extend")
            elif flag not in ("--config-path", "-cp"):
                reason = f"{arg}: a Hydra flag, not an override"
        else:
            overrides.append(arg)
        i += 1
    return overrides, reason


def stand_in(text: str, name: str) -> str:
    """What a user sets a variable the script demands to: the script's own default for it when it has one later
    (``NAME=${NAME:-value}``), else a placeholder path ``/path/to/NAME`` (the variables demanded are storage roots,
    model and adapter paths)."""
    m = re.search(rf"^\s*{name}=\$\{{{name}:-([^${{}}\s\"']+)\}}", text, re.M)
    return m.group(1) if m else f"/path/to/{name}"


def extract(text: str, source: str, commit: str, home: str, verl_root: str) -> Example:
    """The example ``source``: interpreted with no knob set; where the script demands a variable (``${VAR:?}``, an
    unbound one under ``set -u``), again with that variable set as a user would (:func:`stand_in`, listed in
    ``env``)."""
    env: dict[str, str] = {}
    while True:
        try:
            shell = interpret(text, source, home, verl_root, env)
            break
        except NeedsValue as need:
            if need.name in env or len(env) >= 4:
                return Example(source, commit, "grpo", [], f"does not reach main_ppo: it {need}", env)
            env[need.name] = stand_in(text, need.name)
        except ShellError as error:
            return Example(source, commit, "grpo", [], f"the extractor cannot evaluate it: {error}", env)
    if not shell.launches:
        return Example(source, commit, "grpo", [], "does not reach python -m verl.trainer.main_ppo", env)
    overrides, reason = split_hydra_flags(shell.launches[0].argv)
    if len(shell.launches) > 1:
        reason = reason or f"launches main_ppo {len(shell.launches)} times"
    return Example(source, commit, recipe_of(overrides), overrides, reason, env)


def installed_verl() -> tuple[str, Path]:
    """(version, config folder) of the verl installed here, found without importing it."""
    spec = importlib.util.find_spec("verl")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("verl is not installed: its own ppo_trainer tree is needed to check the examples")
    root = Path(list(spec.submodule_search_locations)[0])
    return (root / "version" / "version").read_text().strip(), root / "trainer" / "config"


def verl_refusal(overrides: list[str], config_dir: Path) -> str | None:
    """Why the installed verl refuses ``overrides``, or None: its own ``ppo_trainer`` tree (the one main_ppo
    composes) with Hydra, then its actor and rollout dataclasses (what its workers build; they read no model
    files), none of the recipes' code."""
    name = next((o.split("=", 1)[1].removesuffix(".yaml") for o in overrides if o.startswith("--config-name=")),
                "ppo_trainer")  # a kept --config-name (KEPT_CONFIG_NAMES): verl composes that primary config
    overrides = [o for o in overrides if not o.startswith("-")]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with initialize_config_dir(config_dir=str(config_dir), version_base=None):
                cfg = compose(config_name=name, overrides=overrides)
    except Exception as error:  # noqa: BLE001 - any refusal is the reason
        return str(error).strip().splitlines()[0]
    from verl.utils.config import omega_conf_to_dataclass  # lazy: verl's import is slow and only this needs it

    for key in ("actor_rollout_ref.actor", "actor_rollout_ref.rollout"):
        try:
            omega_conf_to_dataclass(OmegaConf.select(cfg, key))
        except Exception as error:  # noqa: BLE001 - any refusal is the reason
            return f"{key}: {' '.join(str(error).split())[:300]}"
    return None


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def launching_scripts(git_dir: str, ref: str) -> tuple[list[str], int]:
    """(the ``examples/**/*.sh`` of ``ref`` whose text runs ``-m verl.trainer.main_ppo``, sorted; how many .sh)."""
    names = [n for n in git(git_dir, "ls-tree", "-r", "--name-only", ref, "examples").splitlines() if n.endswith(".sh")]
    hits = [n for n in names if LAUNCH_RE.search(git(git_dir, "show", f"{ref}:{n}"))]
    return sorted(hits), len(names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("git_dir", help="verl's git directory (bare is fine)")
    parser.add_argument("--ref", default="v0.9.1", help="tag, branch or commit (default v0.9.1)")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--home", default=DEFAULT_HOME, help=f"what $HOME expands to (default {DEFAULT_HOME})")
    parser.add_argument("--verl-root", default=None, help="where the scripts' verl checkout is (default HOME/verl)")
    args = parser.parse_args(argv)
    commit = git(args.git_dir, "rev-parse", f"{args.ref}^{{commit}}").strip()
    verl_root = args.verl_root or posixpath.join(args.home, "verl")
    scripts, total = launching_scripts(args.git_dir, commit)
    version, config_dir = installed_verl()
    examples = []
    for script in scripts:
        example = extract(git(args.git_dir, "show", f"{commit}:{script}"), script, commit, args.home, verl_root)
        refusal = None if example.skipped else verl_refusal(example.overrides, config_dir)
        if refusal:
            example.skipped = f"verl {version} itself refuses it (python -m {MODULE} fails as well): {refusal}"
        examples.append(example.as_json())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(examples, indent=1, ensure_ascii=False) + "\n")
    skipped = [e for e in examples if e["skipped"]]
    print(f"{total} scripts under examples/, {len(scripts)} run {MODULE}: {len(scripts) - len(skipped)} extracted, "
          f"{len(skipped)} skipped -> {out}")
    for e in skipped:
        print(f"  skipped {e['source']}: {e['skipped']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
