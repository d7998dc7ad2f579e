"""The server's program never ran: ``execve`` refused it, so the log holds no SGLang line, only
what the starter said (the panel's agent, a shell, a container runtime) and exit status 126 or
127.

The mechanism, not one wording: ``execve(2)`` fails with an errno, and every starter prints the
errno's C-library text after the program's name — Python ``[Errno 7] Argument list too long:
'/usr/bin/python3'`` (the agent: ``rankwise: cannot start …``), bash ``bash: …: Argument list
too long``, dash ``sh: 1: …: not found``, Go runtimes ``fork/exec …: argument list too long``.
E2BIG ("Argument list too long") comes from ``execve`` alone, so it is read wherever it
appears; the other errnos read as "no such file" in too many other places, so they count only on
a starter's own line.

Linux's limits (include/uapi/linux/binfmts.h, fs/exec.c): one argument or ``NAME=value``
string at most ``MAX_ARG_STRLEN`` (32 pages, 128 KiB), all of them together at most a quarter of
the stack limit (2 MiB under the usual 8 MiB).
"""

from __future__ import annotations

import re
from typing import Any

from nodes.domain.diagnosis.evidence import Bundle, Diagnosis, Rule
from nodes.domain.env_policy import MAX_ARG_STRLEN, MAX_ENV_BYTES

CATEGORY = "exec-failed"

#: E2BIG's text (glibc strerror, Go's syscall.E2BIG in lower case).
TOO_LONG = re.compile(r"(?i)argument list too long")
#: What a shell exits with when it could not run the command (126: found, not executable;
#: 127: not found, or execve failed), as the agent does when Popen raises.
NOT_RUN_EXITS = (126, 127)
#: A starter's own line: the agent's, a shell's, ``env``'s or a Go runtime's, naming the program.
STARTER = re.compile(
    r"(?:rankwise: cannot start (?P<agent>\S+?): (?:\[Errno \d+\] )?"
    r"|^(?:-?(?:ba|da|z)?sh|/bin/(?:ba)?sh|env)(?:: line \d+|: \d+)?: (?:exec: )?"
    r"(?P<shell>[^\s:]+): "
    r"|(?:fork/)?exec:? (?P<go>[^\s:]+): )"
    r"(?P<why>(?i:no such file or directory|not found|command not found|permission denied"
    r"|exec format error|cannot execute[^\n]*|argument list too long))",
    re.M,
)


def exec_failed(bundle: Bundle) -> Diagnosis | None:
    """The server's program could not be executed; what the errno means and what to change.
    ``None`` when no starter said so."""
    code = (bundle.facts.get("exit") or {}).get("code")
    long_hit = bundle.log.first(TOO_LONG)
    starter = bundle.log.first(STARTER)
    if starter is not None and not (starter[1]["agent"] or code in NOT_RUN_EXITS):
        starter = None  # a shell's "not found" about a helper, while the server itself ran
    hit = long_hit or starter
    if hit is None:
        return None
    program = _program(starter) if starter is not None else None
    numbers: dict[str, float] = {}
    if isinstance(code, int):
        numbers["exit_code"] = code
    if long_hit is not None or starter is None:
        summary, remedy = _too_long(bundle, numbers)
    else:
        summary, remedy = _not_run(starter[1]["why"].lower(), program)
    said = f"the server's program {program} was never run" if program else "the server never ran"
    return Diagnosis(
        category=CATEGORY,
        summary=f"{said}: {summary}",
        remedy=remedy,
        evidence=[bundle.evidence(h) for h in {id(h): h for h in (hit, starter) if h}.values()],
        numbers=numbers,
    )


def _program(hit: tuple[int, re.Match[str]]) -> str | None:
    match = hit[1]
    return match["agent"] or match["shell"] or match["go"]


def _too_long(bundle: Bundle, numbers: dict[str, float]) -> tuple[str, str]:
    extra: dict[str, Any] = bundle.facts.get("extra") or {}
    over = [
        (str(name), int(size))
        for name, size in (extra.get("env_sizes") or {}).items()
        if isinstance(size, int) and size > MAX_ARG_STRLEN
    ]
    total = extra.get("env_total_bytes")
    summary = (
        "Linux refused to start it because its command line and environment are too long "
        f"(execve: E2BIG; one string at most {MAX_ARG_STRLEN:,} bytes, MAX_ARG_STRLEN)"
    )
    if over:
        name, size = max(over, key=lambda o: o[1])
        numbers.update(largest_variable_bytes=size, max_arg_strlen_bytes=MAX_ARG_STRLEN)
        summary += f"; {name} alone is {size:,} bytes"
        remedy = (
            f"shorten or remove {name} (at most {MAX_ARG_STRLEN - len(name) - 2:,} bytes of "
            "value); pass a large value as a file the server reads instead"
        )
    else:
        remedy = (
            f"shorten the environment and command line: each variable or argument at most "
            f"{MAX_ARG_STRLEN:,} bytes, all together well under {MAX_ENV_BYTES * 2:,}; pass a "
            "large value as a file the server reads instead"
        )
    if isinstance(total, int):
        numbers["environment_bytes"] = total
        summary += f"; the environment holds {total:,} bytes in all"
    return summary, remedy


def _not_run(why: str, program: str | None) -> tuple[str, str]:
    name = program or "the interpreter"
    if "format" in why:
        return (
            f"{name} is not a program this node can run ({why}: another architecture, or a "
            "script without its #! line)",
            "point the node's SGLang interpreter at the Python of an environment built for "
            "this node",
        )
    if "permission" in why or "cannot execute" in why:
        return (
            f"{name} is not executable by the user the server runs as ({why})",
            f"make {name} executable for that user, or set the node's SGLang interpreter to one "
            "it may run (node page → Edit)",
        )
    return (
        f"{name} does not exist on the node ({why})",
        "install SGLang's Python environment on the node, or set the node's SGLang interpreter "
        "to the python that has it (node page → Edit; `which python3` there), then rediscover",
    )


#: The line that alone shows the failure (engine._unreadable).
RECOGNISES: dict[Rule, tuple[str, re.Pattern[str]]] = {exec_failed: (CATEGORY, TOO_LONG)}
