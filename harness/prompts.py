"""The prompts of an episode, worded as the official OpenHands SWE-bench runner words them.

- ``instruction_for(problem_statement, base_commit, activate=None)``: the SWE-bench instruction
  (``activate`` = the command that activates the task's environment, e.g. ``SWEBENCH_CONDA_ACTIVATE``).
- ``nudge_text(n)``: the n-th (0-based) "please continue" reply to an agent message without a tool call.
- Profiles (``agent.profile``): ``openhands`` is the above with the SDK's own system prompt;
  ``compact`` has the short ``COMPACT_SYSTEM_PROMPT`` and ``COMPACT_INSTRUCTION_TEMPLATE``
  (``instruction_for(..., profile="compact")``), for short episodes on a CPU.
"""
from __future__ import annotations

REPO_PATH = "/testbed"
# The official OpenHands SWE-bench runner's fake-user reply to an agent message that is not a tool call;
# from the second nudge on it also offers giving up.
NUDGE = ("Please continue working on the task on whatever approach you think is suitable.\n"
         "When you think you have solved the question, please use the finish tool and include your final "
         "answer in the message parameter of the finish tool.\n"
         "IMPORTANT: YOU SHOULD NEVER ASK FOR HUMAN HELP.\n")
NUDGE_GIVE_UP = 'If you want to give up, use the "finish" tool to finish the interaction.\n'
# The official OpenHands SWE-bench runner's default task prompt, word for word.
INSTRUCTION_TEMPLATE = """\
I have access to a python code repository in the directory {repo_path} . You can explore and modify files using the \
available tools. Consider the following issue description:

<issue_description>
{problem_statement}
</issue_description>

Can you help me implement the necessary changes to the repository so that the requirements specified in the \
<issue_description> are met?
I've already taken care of all changes to any of the test files described in the <issue_description>. \
This means you DON'T have to modify the testing logic or any of the tests in any way!
Also the development Python environment is already set up for you (i.e., all dependencies already installed), \
so you don't need to install other packages.
Your task is to make the minimal changes to non-test files in the {repo_path} directory \
to ensure the <issue_description> is satisfied.

Follow these phases to resolve the issue:

Phase 1. READING: read the problem and reword it in clearer terms
   1.1 If there are code or config snippets. Express in words any best practices or conventions in them.
   1.2 Hightlight message errors, method names, variables, file names, stack traces, and technical details.
   1.3 Explain the problem in clear terms.
   1.4 Enumerate the steps to reproduce the problem.
   1.5 Hightlight any best practices to take into account when testing and fixing the issue

Phase 2. RUNNING: install and run the tests on the repository
{phase2}
Phase 3. EXPLORATION: find the files that are related to the problem and possible solutions
   3.1 Use `grep` to search for relevant methods, classes, keywords and error messages.
   3.2 Identify all files related to the problem statement.
   3.3 Propose the methods and files to fix the issue and explain why.
   3.4 From the possible file locations, select the most likely location to fix the issue.

Phase 4. TEST CREATION: before implementing any fix, create a script to reproduce and verify the issue.
   4.1 Look at existing test files in the repository to understand the test format/structure.
   4.2 Create a minimal reproduction script that reproduces the located issue.
   4.3 Run the reproduction script to confirm you are reproducing the issue.
   4.4 Adjust the reproduction script as necessary.

Phase 5. FIX ANALYSIS: state clearly the problem and how to fix it
   5.1 State clearly what the problem is.
   5.2 State clearly where the problem is located.
   5.3 State clearly how the test reproduces the issue.
   5.4 State clearly the best practices to take into account in the fix.
   5.5 State clearly how to fix the problem.

Phase 6. FIX IMPLEMENTATION: Edit the source code to implement your chosen solution.
   6.1 Make minimal, focused changes to fix the issue.

Phase 7. VERIFICATION: Test your implementation thoroughly.
   7.1 Run your reproduction script to verify the fix works.
   7.2 Add edge cases to your test script to ensure comprehensive coverage.
   7.3 Run existing tests related to the modified code to ensure you haven't broken anything.

8. FINAL REVIEW: Carefully re-read the problem description and compare your changes with the base commit {base_commit}.
   8.1 Ensure you've fully addressed all requirements.
   8.2 Run any tests in the repository related to:
     8.2.1 The issue you are fixing
     8.2.2 The files you modified
     8.2.3 The functions you changed
   8.3 If any tests fail, revise your implementation until all tests pass

Be thorough in your exploration, testing, and reasoning. It's fine if your thinking process is lengthy - \
quality and completeness are more important than brevity."""
PHASE2_ACTIVATE = """\
   2.1 Activate the environment by running \u0020
       {activate}
   2.2 Follow the readme
   2.3 Install the environment and anything needed
   2.4 Iterate and figure out how to run the tests
"""
PHASE2_PLAIN = """\
   2.1 Follow the readme
   2.2 Install the environment and anything needed
   2.3 Iterate and figure out how to run the tests
"""
# The official SWE-bench images' environment (pass as ``activate=`` for them).
SWEBENCH_CONDA_ACTIVATE = "source /opt/miniconda3/etc/profile.d/conda.sh ; conda activate testbed"


PROFILES = ("openhands", "compact")
# The compact profile: the agent's system prompt (instead of the SDK's) and its instruction.
COMPACT_SYSTEM_PROMPT = ("You are a coding agent working in a repository. Use the tools to look at the code and "
                         "edit it; call finish when the issue is fixed.")
COMPACT_INSTRUCTION_TEMPLATE = """Python repository: {repo_path} (dependencies installed; tests already updated). \
Fix this issue with a minimal change to non-test files:

<issue_description>
{problem_statement}
</issue_description>"""


def instruction_for(problem_statement: str, base_commit: str | None = None, repo_path: str = REPO_PATH,
                    activate: str | None = None, profile: str = "openhands") -> str:
    """The OpenHands SWE-bench instruction; ``activate`` = the command that activates the task's env.
    ``profile="compact"``: the short instruction (``activate`` is then one line of it)."""
    if profile == "compact":
        text = COMPACT_INSTRUCTION_TEMPLATE.replace("{repo_path}", repo_path)
        if activate:
            text = text.replace("installed;", f"installed: `{activate}`;")
        return text.replace("{problem_statement}", problem_statement)
    if profile != "openhands":
        raise ValueError(f"unknown agent profile {profile!r} (expected one of {PROFILES})")
    phase2 = PHASE2_ACTIVATE.replace("{activate}", activate) if activate else PHASE2_PLAIN
    return (INSTRUCTION_TEMPLATE.replace("{phase2}", phase2).replace("{repo_path}", repo_path)
            .replace("{base_commit}", base_commit or "HEAD").replace("{problem_statement}", problem_statement))


def nudge_text(nudges_sent: int) -> str:
    """The n-th "please continue" message (0-based), worded as the official runner words it."""
    return NUDGE + (NUDGE_GIVE_UP if nudges_sent >= 1 else "")
