"""The agent's environment and parser against hand-written transcripts (no model)."""

import pytest

from jaxrl import prompts
from jaxrl.agent.env import AgentEnv
from jaxrl.agent.parser import ToolCall, parse_call
from jaxrl.agent.run_tests import runner_for, split_tests
from reward.fleet import Fleet
from reward.schema import AssertTests, IOCase, IOTests, Task

CODE = "def total(n):\n    s = 0\n    for i in range(n):\n        s += i\n    return s\n"
RETRY = prompts.agent_retry()


def call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in params.items())
    return f"<function={name}>\n{body}</function>"


def test_the_prompts_are_the_papers():
    system, user = prompts.agent_messages("Sum 0..n.", CODE)
    assert system["role"] == "system" and user["role"] == "user"
    assert system["content"].startswith("You are debugging a single Python file. ONLY fix the bugs. Make minimal "
                                        "edits.\nDo NOT rewrite the file from scratch.")
    assert system["content"].endswith("submit — finish; your current file is scored.\n<function=submit>\n"
                                      "</function>\n\n(The blocks above are format examples, not the actual edit "
                                      "to make.)")
    assert "run_tests" not in system["content"]
    assert user["content"] == (
        "Problem description:\nSum 0..n.\n\nCurrent contents of the file (line numbers shown for reference only — "
        "do not include them in old_str):\n```python\n1 def total(n):\n2     s = 0\n3     for i in range(n):\n"
        "4         s += i\n5     return s\n```\n\nFix the bug(s) with the fewest possible str_replace edits, "
        "then call submit.")
    assert RETRY.startswith("Your last reply contained no tool call, so nothing was applied.")
    assert RETRY.endswith("or call <function=submit></function> if the file is already correct.")
    assert "run_tests" in prompts.agent_messages("x", CODE, run_tests=True)[0]["content"]


def test_parser_takes_the_first_complete_call_around_text_and_thinking():
    reply = ("<think>\nmaybe <function=submit></function>?\n</think>\n\nLet me look.\n"
             + call("view", view_range="[2, 3]") + "\nand then\n" + call("submit"))
    assert parse_call(reply) == ToolCall("view", {"view_range": "[2, 3]"})
    # values may sit on their own lines: one newline after `>` and one before `</parameter>` are dropped
    assert parse_call("<function=str_replace_editor>\n<parameter=old_str>\n  a\n\n</parameter>"
                      "<parameter=new_str>b</parameter><parameter=old_str>z</parameter></function>") == \
        ToolCall("str_replace_editor", {"old_str": "  a\n", "new_str": "b"})
    assert parse_call("<function=view>\n<parameter=view_range>[1, 2]</parameter>") is None  # never closed
    assert parse_call("```python\nprint(1)\n```") is None
    assert parse_call("<think>\n" + call("submit")) is None  # only inside an unclosed think block


def test_views_with_and_without_ranges():
    env = AgentEnv(CODE)
    full = env.step(call("view"))
    assert full.valid and not full.done and full.observation == (
        "1 def total(n):\n2     s = 0\n3     for i in range(n):\n4         s += i\n5     return s")
    assert env.step(call("view", view_range="[3, 4]")).observation == "3     for i in range(n):\n4         s += i"
    assert env.step(call("view", view_range="[4, -1]")).observation == "4         s += i\n5     return s"
    bad = env.step(call("view", view_range="[7, 9]"))
    assert not bad.valid and bad.observation.startswith("Error: view_range [7, 9] is outside the file's 5 lines")
    assert env.file == CODE and env.used == 4


def test_unique_non_unique_and_non_matching_replacements():
    env = AgentEnv(CODE)
    unique = env.step(call("str_replace_editor", old_str="range(n)", new_str="range(n + 1)"))
    assert unique.valid and not unique.edit_failed
    assert env.file == CODE.replace("range(n)", "range(n + 1)")
    assert unique.observation == ("Edit applied. Lines 1-5 now read:\n1 def total(n):\n2     s = 0\n"
                                  "3     for i in range(n + 1):\n4         s += i\n5     return s")
    before = env.file
    twice = env.step(call("str_replace_editor", old_str="s", new_str="t"))
    assert twice.edit_failed and env.file == before
    assert twice.observation == ("Edit failed: old_str was found 3 times; it must occur exactly once "
                                 "(include more surrounding lines).")
    missing = env.step(call("str_replace_editor", old_str="for i in range(n):", new_str="pass"))
    assert missing.edit_failed and env.file == before
    assert missing.observation == "Edit failed: old_str was not found in the current file."


def test_insertion_by_repeated_anchor():
    env = AgentEnv(CODE)
    out = env.step(call("str_replace_editor", old_str="    s = 0", new_str="    s = 0\n    n = abs(n)"))
    assert env.file == CODE.replace("    s = 0\n", "    s = 0\n    n = abs(n)\n")
    assert out.observation.startswith("Edit applied. Lines 1-6 now read:\n"
                                      "1 def total(n):\n2     s = 0\n3     n = abs(n)\n4     for i in range(n):")


def test_two_calls_apply_only_the_first_and_no_call_is_a_retry():
    env = AgentEnv(CODE)
    two = env.step(call("str_replace_editor", old_str="s += i", new_str="s += 2 * i") + call("submit"))
    assert two.call.name == "str_replace_editor" and not two.done and "2 * i" in env.file
    retry = env.step("Here is the fix:\n```python\ndef total(n):\n    return 0\n```")
    assert retry.call is None and not retry.valid and retry.observation == RETRY and "2 * i" in env.file
    assert env.used == 2 and not env.submitted


def test_running_out_of_turns_and_submit_on_turn_one():
    env = AgentEnv(CODE, turns=2)
    assert not env.step(call("view")).done
    last = env.step("no call")
    assert last.done and not env.submitted and env.file == CODE
    with pytest.raises(RuntimeError, match="over"):
        env.step(call("submit"))
    first = AgentEnv(CODE)
    out = first.step("All fine.\n" + call("submit"))
    assert out.done and out.valid and first.submitted and first.used == 1 and first.file == CODE


def test_unknown_and_disabled_tools_are_errors_not_edits():
    env = AgentEnv(CODE)
    assert env.step(call("bash", cmd="ls")).observation == \
        "Error: unknown tool 'bash'; the tools are view, str_replace_editor, submit."
    assert env.step(call("run_tests")).observation == "Error: run_tests is disabled in this session."
    assert env.file == CODE


def test_run_tests_counts_units_in_the_sandbox_and_never_shows_them():
    tests = AssertTests("import math\nassert total(3) == 3\nLIMIT = 4\nassert total(LIMIT) == 6\n"
                        "assert total(0) == 1\n")
    units = split_tests(tests)
    assert [u.code for u in units] == ["import math\nassert total(3) == 3\n",
                                       "import math\nLIMIT = 4\nassert total(LIMIT) == 6\n",
                                       "import math\nLIMIT = 4\nassert total(0) == 1\n"]
    assert len(split_tests(IOTests((IOCase("1", "1"), IOCase("2", "2"))))) == 2
    assert split_tests(AssertTests("def check():\n    assert 1\ncheck()\n")) == [AssertTests(
        "def check():\n    assert 1\ncheck()\n")]
    task = Task("t#0", "t", "Sum 0..n-1.", CODE, CODE, tests)
    with Fleet(workers=2, cache=False) as fleet:
        env = AgentEnv(CODE, run_tests=runner_for(task, fleet.run))
        out = env.step(call("run_tests"))
    assert out.valid and out.observation == "Tests: 2 passed, 1 failed."
