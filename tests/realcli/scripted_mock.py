#!/usr/bin/env python3
"""A scripted mock of the model APIs, for the golden-path runs of the shipped presets through
the real claude, codex and gemini CLIs (tests/golden_path.rs, tests/realcli/golden.sh).

It is tests/realcli/mock_api.py (same routes, same error scenarios, same SSE framing) with
the happy path replaced by a SCRIPT: for each model request it finds, from the conversation,

  * the ralph-flow stage the CLI works for: a marker of the stage's prompt (prompts/PRESET/
    *.md.j2) in the conversation's user text;
  * the turn of that stage: the first of the stage's turns whose `when` texts all appear in
    the prompt (a later loop iteration's prompt holds its history: "### Iteration 1", "##
    Attempt 2 of", a phase id...);
  * the step of that turn: how many tool results the conversation already holds;

and answers the turn's next action as a real tool call of the CLI (claude: `Write`, `Read`,
`Bash`; codex: `exec_command`, or the code-mode `exec` tool with its nested tools; gemini:
`write_file`, `read_file`, `run_shell_command`), or, once every action has its result, the
turn's final answer: text, or JSON for a stage with an output schema (claude: a
`StructuredOutput` tool call, then a short text once its result comes back; codex: the final
message's JSON text; without a schema a fenced JSON block; gemini, which is sent no schema:
the JSON as text, as the stage's prompt asks for it, a fenced block or bare).

The answers are checked as a real model's would be: a JSON answer is given as a model bound
by the schema the CLI sent would give it (a property the script leaves out is null when
the schema makes it required and nullable, as OpenAI's strict mode does) and any way it
still does not fit that schema is logged. A codex request whose output schema OpenAI's
strict mode refuses gets OpenAI's 400 from mock_api's routing (openai_strict.py), whatever
the script says; it is logged here too, as `did: "error:strict-schema"`.

Every answer reports a usage of its own (see `usage_of`), and each answered request is
appended as one JSON line to the file named by SCRIPT_LOG (when set): the api, the stage,
the turn, the step, what was answered, the usage reported, the schema violations, and the
last tool result with whether it says the command or patch succeeded (`last_ok`).
mock_api.py's MOCK_LOG (every request's body) works as there.

SCRIPT_VARIANT=acp plays the script's ACP variant, for the presets' ACP forms run through
claude-agent-acp (golden.sh acp ...): after committing, the agent also asks to `git push`
(`push()`), which their policies deny: the request carrying that tool call's result is
logged with `denied_expected: true`, and the test wants its `last_ok` false. The commands
those policies do not allow and the script does not mean to be denied (`only="cli"`) are
left out.

A request whose path starts with /s/<scenario>/ and whose scenario is one of mock_api's
error scenarios (server_error, rate_limit, ...) gets mock_api's answer. A request the script
does not know (no stage marker, or no turn whose conditions hold) is answered with plain
text and logged with stage or turn null: the test fails on those.

Usage:
  scripted_mock.py [PORT]                  serve (0 or none: any free port); prints the port
  scripted_mock.py --seed PRESET DIR       writes the preset's starting files into DIR
  scripted_mock.py --expect PRESET         prints what a run leaves behind, as JSON:
                                           {"files": {path: content}, "commits": [message],
                                            "turns": [[stage, turn index]]: each must be played,
                                            "json_answers": {stage: [the JSON answers]}}
  scripted_mock.py --list                  the presets with a script
"""

import json
import os
import re
import sys
import time
from http.server import ThreadingHTTPServer

# No __pycache__ in the source tree.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mock_api  # noqa: E402

# ---- the vocabulary of a script -----------------------------------------------------------


def write(path, content):
    """The agent writes `content` to `path` (relative to the cwd) with its file tool."""
    return {"do": "write", "path": path, "content": content}


def read(path):
    """The agent reads `path` with its read tool (codex: `cat`)."""
    return {"do": "read", "path": path}


def bash(command, description="", only=None):
    """The agent runs a shell command in the cwd; with `only="cli"`, not in the ACP variant
    (a command the ACP presets' policies do not allow, and that the script does not mean to
    be denied)."""
    a = {"do": "bash", "command": command, "description": description or command}
    if only is not None:
        a["only"] = only
    return a


def commit(message):
    """The agent commits everything with git."""
    return bash("git add -A && git commit -q -m " + shell_quote(message), "Commit: " + message)


def push(command="git push origin main"):
    """The agent pushes what it committed. Only in the ACP variant (SCRIPT_VARIANT=acp), whose
    presets' policies deny `git push *`: the tool call is expected to fail (`denied`), and the
    turn goes on to its final answer as a model told "no" would."""
    return {"do": "bash", "command": command, "description": "Push the commits", "only": "acp", "denied": True}


def shell_quote(s):
    return "'" + s.replace("'", "'\\''") + "'"


def text(s):
    """A final answer in plain text."""
    return {"text": s}


def answer_json(value):
    """A final answer that is JSON: the structured output when the CLI was given a schema."""
    return {"json": value}


def turn(actions, final, when=(), unless=()):
    """One visit of the agent to a stage: its tool calls in order, then its final answer.
    It applies when every text of `when` and none of `unless` is in the prompt."""
    return {"when": list(when), "unless": list(unless), "actions": actions, "final": final}


def actions_of(t, variant=None):
    """The actions of turn `t` in the script's variant (SCRIPT_VARIANT: `cli`, the default, or
    `acp`): those marked `only` for the other variant are left out."""
    if variant is None:
        variant = os.environ.get("SCRIPT_VARIANT") or "cli"
    return [a for a in t["actions"] if a.get("only") in (None, variant)]


def denied_expected(t, step):
    """Whether the tool call whose result the request at `step` carries is one the script
    expects the agent's policy to deny."""
    acts = actions_of(t) if t else []
    return 0 < step <= len(acts) and bool(acts[step - 1].get("denied"))


def stage(name, marker, *turns):
    return {"name": name, "marker": marker, "turns": list(turns)}


# ---- wiggum-review ------------------------------------------------------------------------
# A small Python module with a bug; the first review fixes it and commits, the second finds
# nothing and the tree is clean: exit `clean` (0) after two iterations.

WIGGUM_BUGGY = '''"""Small statistics helpers."""


def mean(xs):
    """The arithmetic mean of a non-empty list."""
    return sum(xs) / (len(xs) + 1)
'''

WIGGUM_FIXED = '''"""Small statistics helpers."""


def mean(xs):
    """The arithmetic mean of a non-empty list."""
    if not xs:
        raise ValueError("mean of an empty list")
    return sum(xs) / len(xs)
'''

WIGGUM_TEST = '''import unittest

from src.stats import mean


class MeanTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3]), 2)

    def test_empty(self):
        with self.assertRaises(ValueError):
            mean([])


if __name__ == "__main__":
    unittest.main()
'''

WIGGUM = {
    "seed": {
        "src/__init__.py": "",
        "src/stats.py": WIGGUM_BUGGY,
    },
    "commits": ["Fix mean: divide by the count, reject an empty list"],
    "stages": [
        stage(
            "review",
            "You are reviewing this repository with fresh eyes",
            # Iteration 1: finds the bug, fixes it with a test, commits, reports the issue.
            turn(
                [
                    read("src/stats.py"),
                    write("src/stats.py", WIGGUM_FIXED),
                    write("tests/test_stats.py", WIGGUM_TEST),
                    bash("python3 -m unittest discover -s tests -v", "Run the tests"),
                    commit("Fix mean: divide by the count, reject an empty list"),
                    # ACP only: denied by the preset's policy; the remote stays where it was.
                    push(),
                ],
                text(
                    "I fixed and committed the problems I found.\n"
                    "ISSUE: src/stats.py:6 mean divides by len(xs) + 1 instead of len(xs)\n"
                    "ISSUE: src/stats.py:6 mean of an empty list is not reported as an error"
                ),
                unless=["### Iteration 1"],
            ),
            # Iteration 2: a fresh review finds nothing; the tree is clean.
            turn(
                [
                    read("src/stats.py"),
                    bash("git status --porcelain && git log --oneline -3", "Check the tree"),
                ],
                text("The module is correct and tested; nothing to fix.\nNO_ISSUES"),
                when=["### Iteration 1"],
            ),
        )
    ],
}

# ---- cairo-driver-reviewer ----------------------------------------------------------------
# The driver writes the code (ralph-flow writes it to src/lib.cairo); the first review finds
# a missing test (INVALID), the second attempt adds it and the review says VALID; then
# `scarb fmt --check`, `build` and `test` (a fake scarb) pass: exit `success` (0).

CAIRO_TASK = "Write `fn add(a: u32, b: u32) -> u32` that returns the sum, with a unit test.\n"
CAIRO_RUBRIC = "- The function is correct.\n- There is a `#[test]` that checks it.\n"
CAIRO_CODE_1 = "fn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n"
CAIRO_CODE_2 = (
    "fn add(a: u32, b: u32) -> u32 {\n    a + b\n}\n\n"
    "#[cfg(test)]\nmod tests {\n    use super::add;\n\n"
    "    #[test]\n    fn it_adds() {\n        assert(add(2, 3) == 5, 'add');\n    }\n}\n"
)
CAIRO_SCARB = '[package]\nname = "demo"\nversion = "0.1.0"\nedition = "2024_07"\n'

CAIRO = {
    "seed": {
        "Scarb.toml": CAIRO_SCARB,
        "task.md": CAIRO_TASK,
        "rubric.md": CAIRO_RUBRIC,
    },
    # ralph-flow's write_code stage writes src/lib.cairo; nothing is committed.
    "files": {"src/lib.cairo": CAIRO_CODE_2},
    "commits": [],
    "stages": [
        stage(
            "driver",
            "You are the driver. Write Cairo code",
            turn(
                [read("Scarb.toml")],
                answer_json({"code": CAIRO_CODE_1, "notes": "A plain u32 addition."}),
                unless=["## Attempt 2 of"],
            ),
            turn(
                [read("src/lib.cairo")],
                answer_json({"code": CAIRO_CODE_2, "notes": "Added the unit test the reviewer asked for."}),
                when=["## Attempt 2 of", "it has no test"],
            ),
        ),
        stage(
            "reviewer",
            "You are the reviewer. Judge the code below against the rubric",
            turn(
                [read("src/lib.cairo")],
                answer_json(
                    {
                        "verdict": "INVALID",
                        "issues": [
                            {
                                "criterion": "There is a #[test] that checks it.",
                                "severity": "error",
                                "description": "add is correct but it has no test.",
                                "suggestion": "Add a #[test] asserting add(2, 3) == 5.",
                            }
                        ],
                        "notes": "One rubric item fails.",
                    }
                ),
                unless=["mod tests"],
            ),
            turn(
                [read("src/lib.cairo")],
                answer_json({"verdict": "VALID", "issues": [], "notes": "Correct and tested."}),
                when=["mod tests"],
            ),
        ),
    ],
}

# ---- spider -------------------------------------------------------------------------------
# A word-count module in two plan phases; the spec and the plan are approved by a person (the
# test answers the gates); each phase is implemented, defended with tests (python3 -m
# unittest) and evaluated; in phase 2 the first defend round commits a wrong test, the
# project's tests fail, and the second round fixes it from their output; the review
# approves: exit `success` (0).

SPIDER_BRIEF = """# Word count

A small Python module `wc.py`: `count_words(text)` returns the number of
whitespace-separated words, and `python3 wc.py` prints the count of stdin.
"""

SPIDER_SPEC = """# Spec: word count

## Problem
People need the number of words in a text, from Python and from the shell.

## Behaviour
- `count_words(text)` returns the number of whitespace-separated words (0 for blank text).
- `python3 wc.py` reads stdin and prints the count followed by a newline.

## Non-goals
Counting lines or characters.

## Acceptance criteria
1. `count_words("a b  c")` is 3 and `count_words("   ")` is 0.
2. `printf 'x y' | python3 wc.py` prints `2`.
"""

SPIDER_PLAN = """# Plan: word count

## Phase 1: phase-1-count (the counting function)
`count_words` in wc.py with its unit tests. Acceptance: criterion 1.

## Phase 2: phase-2-cli (the command line)
`python3 wc.py` prints the count of stdin. Acceptance: criterion 2.
"""

SPIDER_WC_1 = '''"""Word count."""


def count_words(text):
    """The number of whitespace-separated words in `text`."""
    return len(text.split())
'''

SPIDER_WC_2 = '''"""Word count."""

import sys


def count_words(text):
    """The number of whitespace-separated words in `text`."""
    return len(text.split())


def main():
    print(count_words(sys.stdin.read()))


if __name__ == "__main__":
    main()
'''

SPIDER_TEST_1 = '''import unittest

from wc import count_words


class CountWordsTest(unittest.TestCase):
    def test_words(self):
        self.assertEqual(count_words("a b  c"), 3)

    def test_blank(self):
        self.assertEqual(count_words("   "), 0)


if __name__ == "__main__":
    unittest.main()
'''

SPIDER_TEST_2 = '''import subprocess
import sys
import unittest


class CliTest(unittest.TestCase):
    def test_stdin(self):
        out = subprocess.run(
            [sys.executable, "wc.py"], input="x y", capture_output=True, text=True, check=True
        )
        self.assertEqual(out.stdout, "2\\n")


if __name__ == "__main__":
    unittest.main()
'''

# The first test of the command line is wrong (print adds a newline): the project's tests
# fail in the defend loop's check, and the next round fixes the test.
SPIDER_TEST_2_WRONG = SPIDER_TEST_2.replace('"2\\n"', '"2"')
assert SPIDER_TEST_2_WRONG != SPIDER_TEST_2

SPIDER_REVIEW = """# Review: word count

## Summary
Both phases are implemented as specified, each with tests that fail without the code.

## Good
- Small, documented functions; the CLI is a thin wrapper.

## Problems
None blocking.

## Recommendation
Approve.
"""

SPIDER_TESTS = "python3 -m unittest discover -s tests -v"

SPIDER = {
    "seed": {"BRIEF.md": SPIDER_BRIEF},
    "files": {
        "docs/spec.md": SPIDER_SPEC,
        "docs/plan.md": SPIDER_PLAN,
        "docs/review.md": SPIDER_REVIEW,
        "wc.py": SPIDER_WC_2,
        "tests/test_count.py": SPIDER_TEST_1,
        "tests/test_cli.py": SPIDER_TEST_2,
    },
    "commits": [
        "phase-1-count: count_words",
        "phase-1-count: tests for count_words",
        "phase-2-cli: python3 wc.py counts stdin",
        "phase-2-cli: a test of the command line",
        "phase-2-cli: the CLI test expects the newline print writes",
        "Review of the word count",
    ],
    "stages": [
        stage(
            "specify",
            "You are the Specify step of the SPIDER protocol",
            turn(
                [read("BRIEF.md"), bash("mkdir -p docs", "Make docs/", only="cli"), write("docs/spec.md", SPIDER_SPEC)],
                answer_json(
                    {
                        "spec_path": "docs/spec.md",
                        "summary": "A word-count function and a command line that prints the count of stdin.",
                        "open_questions": [],
                        "changes": [],
                    }
                ),
            ),
        ),
        stage(
            "plan",
            "You are the Plan step of the SPIDER protocol",
            turn(
                [read("docs/spec.md"), write("docs/plan.md", SPIDER_PLAN)],
                answer_json(
                    {
                        "plan_path": "docs/plan.md",
                        "phases": [
                            {
                                "id": "phase-1-count",
                                "title": "The counting function",
                                "goal": "count_words returns the number of words",
                                "deliverables": ["wc.py: count_words"],
                                "acceptance": ['count_words("a b  c") is 3 and count_words("   ") is 0'],
                                "files": ["wc.py", "tests/test_count.py"],
                            },
                            {
                                "id": "phase-2-cli",
                                "title": "The command line",
                                "goal": "python3 wc.py prints the count of stdin",
                                "deliverables": ["wc.py: main"],
                                "acceptance": ["printf 'x y' | python3 wc.py prints 2"],
                                "files": ["wc.py", "tests/test_cli.py"],
                            },
                        ],
                        "risks": ["none worth naming"],
                    }
                ),
            ),
        ),
        stage(
            "implement",
            "You are the Implement step of SPIDER",
            turn(
                [
                    read("docs/plan.md"),
                    write("wc.py", SPIDER_WC_1),
                    bash("python3 -c 'from wc import count_words; print(count_words(\"a b\"))'", "Try it", only="cli"),
                    commit("phase-1-count: count_words"),
                    # ACP only: denied by the preset's policy; the remote stays where it was.
                    push(),
                ],
                answer_json(
                    {
                        "summary": "count_words in wc.py.",
                        "files_changed": ["wc.py"],
                        "tests_added": [],
                        "notes": "The tests step should cover blank text.",
                    }
                ),
                when=["phase `phase-1-count`"],
            ),
            turn(
                [
                    read("wc.py"),
                    write("wc.py", SPIDER_WC_2),
                    bash(SPIDER_TESTS, "Run the tests"),
                    commit("phase-2-cli: python3 wc.py counts stdin"),
                ],
                answer_json(
                    {
                        "summary": "main() in wc.py prints the count of stdin.",
                        "files_changed": ["wc.py"],
                        "tests_added": [],
                        "notes": "Test it through a subprocess.",
                    }
                ),
                when=["phase `phase-2-cli`"],
            ),
        ),
        stage(
            "write_tests",
            "You are the Defend step of SPIDER",
            turn(
                [
                    write("tests/test_count.py", SPIDER_TEST_1),
                    bash(SPIDER_TESTS, "Run the tests"),
                    commit("phase-1-count: tests for count_words"),
                ],
                answer_json(
                    {
                        "summary": "Tests of count_words on words and on blank text.",
                        "files_changed": ["tests/test_count.py"],
                        "tests_added": ["CountWordsTest.test_words", "CountWordsTest.test_blank"],
                    }
                ),
                when=["phase `phase-1-count`"],
            ),
            # Round 1 of phase 2 commits a wrong test without running it...
            turn(
                [
                    write("tests/test_cli.py", SPIDER_TEST_2_WRONG),
                    commit("phase-2-cli: a test of the command line"),
                ],
                answer_json(
                    {
                        "summary": "A test of python3 wc.py through a subprocess.",
                        "files_changed": ["tests/test_cli.py"],
                        "tests_added": ["CliTest.test_stdin"],
                    }
                ),
                when=["phase `phase-2-cli`"],
                unless=["The test command failed in the previous round"],
            ),
            # ...the check fails, and round 2 starts from its output: the test is wrong.
            turn(
                [
                    read("tests/test_cli.py"),
                    write("tests/test_cli.py", SPIDER_TEST_2),
                    bash(SPIDER_TESTS, "Run the tests"),
                    commit("phase-2-cli: the CLI test expects the newline print writes"),
                ],
                answer_json(
                    {
                        "summary": "The CLI test expected no newline; print writes one. Fixed the test.",
                        "files_changed": ["tests/test_cli.py"],
                        "tests_added": [],
                        "notes": "The code was right; the test was wrong about the spec.",
                    }
                ),
                when=["phase `phase-2-cli`", "The test command failed in the previous round", "AssertionError: '2\\n' != '2'"],
            ),
        ),
        stage(
            "evaluate",
            "You are the Evaluate step of SPIDER",
            turn(
                [bash("git log --oneline -5 && " + SPIDER_TESTS, "Read the history and run the tests")],
                text("Criterion 1 is met by count_words and CountWordsTest.\nVERDICT: PASS"),
                when=["phase `phase-1-count`"],
            ),
            turn(
                [bash("git log --oneline -5 && " + SPIDER_TESTS, "Read the history and run the tests")],
                text("Criterion 2 is met by main and CliTest.\nVERDICT: PASS"),
                when=["phase `phase-2-cli`"],
            ),
        ),
        stage(
            "review",
            "You are the Review step of SPIDER",
            turn(
                [
                    bash("git log --oneline && git show --stat HEAD", "Read the commits"),
                    write("docs/review.md", SPIDER_REVIEW),
                    commit("Review of the word count"),
                ],
                text("The work meets the spec; the review is in docs/review.md.\nVERDICT: APPROVE"),
            ),
        ),
    ],
}

SCRIPTS = {"wiggum-review": WIGGUM, "cairo-driver-reviewer": CAIRO, "spider": SPIDER}

# ---- what a run leaves behind -------------------------------------------------------------


def expected(preset):
    """The files the script's writes leave (the last write of each path wins, in stage order
    as the run goes) and the commit messages, oldest first."""
    script = SCRIPTS[preset]
    if "files" in script:
        files = dict(script["files"])
    else:
        files = {}
        for st in script["stages"]:
            for t in st["turns"]:
                for a in actions_of(t):
                    if a["do"] == "write":
                        files[a["path"]] = a["content"]
    turns = [[st["name"], i] for st in script["stages"] for i in range(len(st["turns"]))]
    answers = {}
    for st in script["stages"]:
        for t in st["turns"]:
            if "json" in t["final"]:
                answers.setdefault(st["name"], []).append(t["final"]["json"])
    return {"files": files, "commits": list(script["commits"]), "turns": turns, "json_answers": answers}


def seed(preset, directory):
    for path, content in SCRIPTS[preset]["seed"].items():
        full = os.path.join(directory, path)
        os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(content)


# ---- finding the stage, the turn and the step ---------------------------------------------

STAGES = [(preset, st) for preset, script in SCRIPTS.items() for st in script["stages"]]


def find_turn(prompt):
    """(preset, stage, turn index, turn) for a prompt, or Nones."""
    for preset, st in STAGES:
        if st["marker"] in prompt:
            for i, t in enumerate(st["turns"]):
                if all(w in prompt for w in t["when"]) and not any(u in prompt for u in t["unless"]):
                    return preset, st, i, t
            return preset, st, None, None
    return None, None, None, None


def usage_of(stage_name, turn_index, step):
    """Distinct, deterministic numbers per request, so that a sum tells requests apart."""
    seed_n = sum(map(ord, stage_name or "?"))
    return {
        "input": 1000 + seed_n + 100 * (turn_index or 0) + 37 * step,
        "output": 50 + (seed_n % 97) + 11 * step,
        "cached": 64 + step,
    }


def script_log(entry):
    path = os.environ.get("SCRIPT_LOG")
    if not path:
        return
    with mock_api.LOCK, open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(entry) + "\n")


def codex_ok(output):
    """Whether a codex tool result says its command or patch succeeded: the exit codes it
    reports are 0 and, from the code-mode `exec` tool, the script completed."""
    if isinstance(output, list):
        texts = [c.get("text") or "" for c in output if isinstance(c, dict)]
        if texts and not texts[0].startswith("Script completed"):
            return False
        s = "\n".join(texts)
    else:
        s = output if isinstance(output, str) else json.dumps(output)
    codes = re.findall(r'(?:Process exited with code|Exit code:|"exit_code":) ?(-?\d+)', s)
    return all(c == "0" for c in codes) and "apply_patch failed" not in s


def gemini_ok(response):
    """Whether a gemini tool result says its tool succeeded: no `error`, and no non-zero
    `Exit Code:` (run_shell_command states one only when the command failed)."""
    if not isinstance(response, dict) or "error" in response:
        return False
    out = response.get("output")
    s = out if isinstance(out, str) else json.dumps(out)
    codes = re.findall(r"^(?:Exit Code|Signal): ?(\S+)", s, re.M)
    return all(c == "0" for c in codes) and not re.search(r"^Error: ", s, re.M)


ERROR_SCENARIOS = {"server_error", "rate_limit", "overloaded", "invalid_key", "usage_limit"}


def types_of(schema):
    t = schema.get("type") if isinstance(schema, dict) else None
    return set(t) if isinstance(t, list) else ({t} if t else set())


def conform(value, schema):
    """The script's answer as a model bound by `schema` gives it: under OpenAI's strict mode
    every property is required and an optional one is nullable, so a property the script
    leaves out is given as null where the schema allows null."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        out = {}
        for key, sub in schema["properties"].items():
            if key in value:
                out[key] = conform(value[key], sub)
            elif key in (schema.get("required") or []) and "null" in types_of(sub):
                out[key] = None
        for key in value:
            if key not in out:
                out[key] = value[key]
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [conform(v, schema["items"]) for v in value]
    return value


def violations(value, schema, path="$"):
    """What of `value` does not fit `schema` (the keywords the presets' schemas use)."""
    if not isinstance(schema, dict):
        return []
    out = []
    kinds = types_of(schema)
    actual = {
        type(None): "null",
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), "?")
    if kinds and actual not in kinds and not (actual == "integer" and "number" in kinds):
        return [f"{path}: {actual} is not {sorted(kinds)}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            out.append(f"{path}: shorter than {schema['minLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{path}: does not match {schema['pattern']}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            out.append(f"{path}: fewer than {schema['minItems']} items")
        for i, v in enumerate(value):
            out += violations(v, schema.get("items"), f"{path}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key in schema.get("required") or []:
            if key not in value:
                out.append(f"{path}: {key} is missing")
        for key, v in value.items():
            if key in props:
                out += violations(v, props[key], f"{path}.{key}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{path}: {key} is not allowed")
    return out



def fenced(value):
    return "```json\n" + json.dumps(value, indent=2) + "\n```"


def patch_for(path, content):
    """An apply_patch patch that makes `path` hold `content` (an Add File replaces a file)."""
    lines = content.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    body = "".join("+" + line + "\n" for line in lines)
    return "*** Begin Patch\n*** Add File: " + path + "\n" + body + "*** End Patch\n"


class ScriptedHandler(mock_api.Handler):
    server_version = "scripted-mock/1"

    # ---- Anthropic (claude) ---------------------------------------------------------------

    def anthropic(self, scenario, body):
        if scenario in ERROR_SCENARIOS:
            return super().anthropic(scenario, body)
        tools = {t.get("name"): t for t in body.get("tools") or [] if isinstance(t, dict)}
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        prompt, cwd = "", ""
        results = []
        for m in messages:
            content = m.get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content or []
            for c in blocks:
                if not isinstance(c, dict):
                    continue
                if c.get("type") == "tool_result":
                    results.append(c)
                elif c.get("type") == "text" and m.get("role") == "user":
                    t = c.get("text") or ""
                    found = re.search(r"Primary working directory: (/\S+)", t)
                    if found and not cwd:
                        cwd = found.group(1)
                    if not t.startswith("<system-reminder>"):
                        prompt += t + "\n"
        # The tool_use ids answered: a StructuredOutput already given ends the turn.
        structured_done = any(
            isinstance(c, dict) and c.get("type") == "tool_use" and c.get("name") == "StructuredOutput"
            for m in messages
            if m.get("role") == "assistant" and isinstance(m.get("content"), list)
            for c in m["content"]
        )
        preset, st, ti, t = find_turn(prompt) if tools else (None, None, None, None)
        step = len(results)
        self.violations = []
        content, stop, did = self.claude_answer(t, step, cwd, tools, structured_done)
        name = st["name"] if st else None
        u = usage_of(name, ti, step)
        script_log(
            {
                "api": "anthropic",
                "preset": preset,
                "stage": name,
                "turn": ti,
                "step": step,
                "tools": bool(tools),
                "did": did,
                "usage": u,
                "schema_violations": self.violations,
                "last_result": str(results[-1].get("content"))[:2000] if results else None,
                "last_ok": (not results[-1].get("is_error")) if results else None,
                "denied_expected": denied_expected(t, step),
            }
        )
        self.anthropic_stream(body, content, stop, u)

    def claude_answer(self, t, step, cwd, tools, structured_done):
        """(content blocks, stop reason, what was done) for step `step` of turn `t`."""
        if t is None:
            # A side request, or a prompt the script does not know.
            return [{"type": "text", "text": "ok"}], "end_turn", "text:unscripted"
        tool_id = "toolu_01SCRIPT%017d" % step
        acts = actions_of(t)
        if step < len(acts):
            a = acts[step]
            if a["do"] == "write":
                call = ("Write", {"file_path": os.path.join(cwd, a["path"]), "content": a["content"]})
            elif a["do"] == "read":
                call = ("Read", {"file_path": os.path.join(cwd, a["path"])})
            else:
                call = ("Bash", {"command": a["command"], "description": a["description"]})
            block = {"type": "tool_use", "id": tool_id, "name": call[0], "input": call[1]}
            return [block], "tool_use", a["do"] + ":" + (a.get("path") or a.get("command"))
        final = t["final"]
        if "json" in final:
            if "StructuredOutput" in tools and not structured_done:
                schema = tools["StructuredOutput"].get("input_schema")
                value = conform(final["json"], schema)
                self.violations = violations(value, schema)
                block = {"type": "tool_use", "id": tool_id, "name": "StructuredOutput", "input": value}
                return [block], "tool_use", "structured"
            if structured_done:
                return [{"type": "text", "text": "Done."}], "end_turn", "text:after-structured"
            return [{"type": "text", "text": fenced(final["json"])}], "end_turn", "fenced-json"
        return [{"type": "text", "text": final["text"]}], "end_turn", "text"

    def anthropic_stream(self, body, content, stop, u):
        usage = {
            "input_tokens": u["input"],
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": u["cached"],
            "output_tokens": u["output"],
            "service_tier": "standard",
        }
        model = body.get("model", "claude-mock")
        msg_id = "msg_01SCRIPTED000000000000001"
        if not body.get("stream"):
            return self.send_json(
                200,
                {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": content,
                    "stop_reason": stop,
                    "stop_sequence": None,
                    "usage": usage,
                },
            )
        self.start_sse([("request-id", "req_011SCRIPTED00000000000001")])
        self.sse(
            {
                "type": "message_start",
                "message": {
                    "id": msg_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": dict(usage, output_tokens=1),
                },
            },
            "message_start",
        )
        for i, block in enumerate(content):
            if block["type"] == "text":
                start = {"type": "text", "text": ""}
                delta = {"type": "text_delta", "text": block["text"]}
            else:
                start = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
                delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            self.sse({"type": "content_block_start", "index": i, "content_block": start}, "content_block_start")
            self.sse({"type": "content_block_delta", "index": i, "delta": delta}, "content_block_delta")
            self.sse({"type": "content_block_stop", "index": i}, "content_block_stop")
        self.sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop, "stop_sequence": None},
                "usage": {k: v for k, v in usage.items() if k != "service_tier"},
            },
            "message_delta",
        )
        self.sse({"type": "message_stop"}, "message_stop")

    # ---- OpenAI Responses (codex) ---------------------------------------------------------

    def schema_refused(self, api, body, refusal):
        """mock_api refuses the request's strict schema (as OpenAI would): logged."""
        _, _, prompt, results = self.openai_request(body)
        preset, st, ti, _ = find_turn(prompt)
        message = ((refusal[1] or {}).get("error") or {}).get("message") if isinstance(refusal[1], dict) else None
        script_log(
            {
                "api": "openai",
                "preset": preset,
                "stage": st["name"] if st else None,
                "turn": ti,
                "step": len(results),
                "tools": True,
                "did": "error:strict-schema",
                "usage": None,
                "schema_violations": [message or str(refusal)],
                "last_result": None,
                "last_ok": None,
            }
        )

    @staticmethod
    def openai_request(body):
        """(tools by name, text.format, the prompt, the tool results) of a Responses request."""
        inputs = [i for i in body.get("input") or [] if isinstance(i, dict)]
        tools = {}

        def collect(ts):
            for t in ts or []:
                if isinstance(t, dict):
                    tools[t.get("name") or t.get("type")] = t
                    collect(t.get("tools"))

        collect(body.get("tools"))
        for i in inputs:
            if i.get("type") == "additional_tools":
                collect(i.get("tools"))
        prompt = ""
        results = []
        for i in inputs:
            if i.get("type") in ("function_call_output", "custom_tool_call_output"):
                results.append(i)
            elif i.get("type") == "message" and i.get("role") == "user":
                for c in i.get("content") or []:
                    t = c.get("text") or "" if isinstance(c, dict) else ""
                    if not t.lstrip().startswith("<environment_context>"):
                        prompt += t + "\n"
        fmt = (body.get("text") or {}).get("format") or {}
        return tools, fmt, prompt, results

    def openai(self, scenario, body):
        if scenario in ERROR_SCENARIOS:
            return super().openai(scenario, body)
        tools, fmt, prompt, results = self.openai_request(body)
        schema = (fmt.get("schema") or {}) if fmt.get("type") == "json_schema" else None
        preset, st, ti, t = find_turn(prompt)
        step = len(results)
        self.violations = []
        items, did = self.codex_answer(t, step, tools, schema)
        name = st["name"] if st else None
        u = usage_of(name, ti, step)
        script_log(
            {
                "api": "openai",
                "preset": preset,
                "stage": name,
                "turn": ti,
                "step": step,
                "tools": bool(tools),
                "did": did,
                "usage": u,
                "schema_violations": self.violations,
                "last_result": str(results[-1].get("output"))[:2000] if results else None,
                "last_ok": codex_ok(results[-1].get("output")) if results else None,
                "denied_expected": denied_expected(t, step),
            }
        )
        self.openai_stream(body, items, u)

    def codex_answer(self, t, step, tools, schema):
        schema_mode = schema is not None
        call_id = "call_script%04d" % step
        if t is None:
            return [self.openai_message("ok")], "text:unscripted"
        acts = actions_of(t)
        if step < len(acts):
            a = acts[step]
            did = a["do"] + ":" + (a.get("path") or a.get("command"))
            code_mode = "exec" in tools and tools["exec"].get("type") == "custom"
            if a["do"] == "write":
                patch = patch_for(a["path"], a["content"])
                if code_mode:
                    js = "text(JSON.stringify(await tools.apply_patch(" + json.dumps(patch) + ")));\n"
                    return [self.custom_call(call_id, "exec", js)], did
                if "apply_patch" in tools and tools["apply_patch"].get("type") == "custom":
                    return [self.custom_call(call_id, "apply_patch", patch)], did
                if "apply_patch" in tools:
                    return [self.function_call(call_id, "apply_patch", {"input": patch})], did
                # Only a shell: codex recognises an `apply_patch` heredoc and applies it itself.
                cmd = "apply_patch <<'PATCH'\n" + patch + "PATCH\n"
            elif a["do"] == "read":
                cmd = "cat " + shell_quote(a["path"])
            else:
                cmd = a["command"]
            if code_mode:
                js = (
                    "text(JSON.stringify(await tools.exec_command("
                    + json.dumps({"cmd": cmd, "yield_time_ms": 120000})
                    + ")));\n"
                )
                return [self.custom_call(call_id, "exec", js)], did
            if "exec_command" in tools:
                return [self.function_call(call_id, "exec_command", {"cmd": cmd, "yield_time_ms": 120000})], did
            return [self.function_call(call_id, "shell", {"command": ["bash", "-lc", cmd], "timeout_ms": 120000})], did
        final = t["final"]
        if "json" in final:
            if schema_mode:
                value = conform(final["json"], schema)
                self.violations = violations(value, schema)
                return [self.openai_message(json.dumps(value))], "json"
            return [self.openai_message(fenced(final["json"]))], "fenced-json"
        return [self.openai_message(final["text"])], "text"

    @staticmethod
    def openai_message(s):
        return {
            "type": "message",
            "id": "msg_script1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": s, "annotations": []}],
        }

    @staticmethod
    def function_call(call_id, name, args):
        return {
            "type": "function_call",
            "id": "fc_" + call_id,
            "status": "completed",
            "call_id": call_id,
            "name": name,
            "arguments": json.dumps(args),
        }

    @staticmethod
    def custom_call(call_id, name, data):
        return {
            "type": "custom_tool_call",
            "id": "ctc_" + call_id,
            "status": "completed",
            "call_id": call_id,
            "name": name,
            "input": data,
        }

    def openai_stream(self, body, items, u):
        usage = {
            "input_tokens": u["input"],
            "input_tokens_details": {"cached_tokens": u["cached"]},
            "output_tokens": u["output"],
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": u["input"] + u["output"],
        }
        return self.responses_reply(body, items, usage, body.get("model", "gpt-mock"), "resp_script1")

    # ---- Gemini API (gemini) --------------------------------------------------------------

    @staticmethod
    def gemini_request(body):
        """(tool declarations by name, the prompt, the tool results) of a Gemini request. The
        prompt is the user's text past gemini's own `<session_context>` part; a result is a
        `functionResponse` part."""
        tools = {}
        for t in body.get("tools") or []:
            for d in (t or {}).get("functionDeclarations") or []:
                if isinstance(d, dict):
                    tools[d.get("name")] = d
        prompt = ""
        results = []
        for c in body.get("contents") or []:
            if not isinstance(c, dict):
                continue
            for part in c.get("parts") or []:
                if not isinstance(part, dict):
                    continue
                if "functionResponse" in part:
                    results.append(part["functionResponse"])
                elif c.get("role") == "user" and isinstance(part.get("text"), str):
                    if not part["text"].lstrip().startswith("<session_context>"):
                        prompt += part["text"] + "\n"
        return tools, prompt, results

    def gemini(self, scenario, body, model, stream):
        if scenario in ERROR_SCENARIOS or not stream:
            # An error scenario, or a side request (the model router's classifier, without
            # `--model`): mock_api's answer, logged with its usage and no stage.
            if scenario not in ERROR_SCENARIOS:
                script_log(
                    {
                        "api": "gemini",
                        "preset": None,
                        "stage": None,
                        "turn": None,
                        "step": None,
                        "tools": False,
                        "did": "side-request",
                        "usage": {
                            "input": mock_api.SIDE_INPUT_TOKENS,
                            "output": mock_api.SIDE_OUTPUT_TOKENS,
                            "cached": 0,
                        },
                        "schema_violations": [],
                        "last_result": None,
                        "last_ok": None,
                    }
                )
            return super().gemini(scenario, body, model, stream)
        tools, prompt, results = self.gemini_request(body)
        preset, st, ti, t = find_turn(prompt) if tools else (None, None, None, None)
        step = len(results)
        parts, did = self.gemini_answer(t, step, prompt)
        name = st["name"] if st else None
        u = usage_of(name, ti, step)
        last = results[-1].get("response") if results else None
        script_log(
            {
                "api": "gemini",
                "preset": preset,
                "stage": name,
                "turn": ti,
                "step": step,
                "tools": bool(tools),
                "did": did,
                "usage": u,
                "schema_violations": [],
                "last_result": json.dumps(last)[:2000] if results else None,
                "last_ok": gemini_ok(last) if results else None,
                "denied_expected": denied_expected(t, step),
            }
        )
        # promptTokenCount holds the cached tokens (gemini's stats: `prompt`, and `input` is
        # prompt - cached), as OpenAI's input_tokens do.
        usage = {
            "promptTokenCount": u["input"],
            "candidatesTokenCount": u["output"],
            "cachedContentTokenCount": u["cached"],
            "totalTokenCount": u["input"] + u["output"],
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": u["input"]}],
        }
        self.start_sse()
        self.sse(
            {
                "candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": usage,
                "modelVersion": model,
                "responseId": "scriptedResponse%04d" % step,
            }
        )

    @staticmethod
    def gemini_answer(t, step, prompt):
        """(parts, what was done) for step `step` of turn `t`: gemini's tools take paths
        relative to its workspace (the cwd). gemini is sent no schema (ralph-flow's
        `structured_output = "auto"` sends nothing), so a JSON answer is text, as the
        stage's prompt asks for it: one fenced block, else bare JSON."""
        if t is None:
            return [{"text": "ok"}], "text:unscripted"
        acts = actions_of(t)
        if step < len(acts):
            a = acts[step]
            if a["do"] == "write":
                call = {"name": "write_file", "args": {"file_path": a["path"], "content": a["content"]}}
            elif a["do"] == "read":
                call = {"name": "read_file", "args": {"file_path": a["path"]}}
            else:
                call = {"name": "run_shell_command", "args": {"command": a["command"], "description": a["description"]}}
            return [{"functionCall": call}], a["do"] + ":" + (a.get("path") or a.get("command"))
        final = t["final"]
        if "json" in final:
            if "fenced JSON block" in prompt:
                return [{"text": fenced(final["json"])}], "fenced-json"
            return [{"text": json.dumps(final["json"])}], "json"
        return [{"text": final["text"]}], "text"


def main():
    args = sys.argv[1:]
    if args[:1] == ["--seed"]:
        seed(args[1], args[2])
        return
    if args[:1] == ["--expect"]:
        print(json.dumps(expected(args[1])))
        return
    if args[:1] == ["--list"]:
        print("\n".join(SCRIPTS))
        return
    port = int(args[0]) if args else 0
    server = ThreadingHTTPServer(("127.0.0.1", port), ScriptedHandler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
