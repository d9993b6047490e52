"""The library's advice in the command's terms, and compiler output kept in its place.

conveyor's errors speak Python (``block_bytes=``, ``a.astype(np.float32)``, ``args=``); the
command prints them with the option that does the same (``--block-bytes``, ``--cast``,
``--arg``) and names each input by the file it came from.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence

_Rule = tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]

_RULES: list[_Rule] = [
    # A dtype that is no \w+ word (strings, records, dates) left after _ASTYPE: no --cast
    # or a.astype the command can do makes numbers of it.
    (re.compile(r"(but input \d+ has dtype .+?): pass an array of (\w+) \(e\.g\. "
                r"a\.astype\(np\.\w+\)\)(?: or declare the parameter \S+)?"),
     r"\1, which the command cannot convert to \2 (--cast converts plain numbers only): "
     r"write the file's values as plain numbers first"),
    (re.compile(r"use a lower memory_limit, smaller blocks \(block_bytes=\) or a lower depth"),
     "use a lower --memory-limit, smaller blocks (--block-bytes) or a lower --depth"),
    (re.compile(r"use block_bytes >= (\d+)"), r"use --block-bytes \1 or more"),
    (re.compile(r"block_bytes=(\d+)"), r"--block-bytes \1"),
    (re.compile(r"a smaller block_bytes or depth"), "a smaller --block-bytes or --depth"),
    (re.compile(r"\ba lower depth\b"), "a lower --depth"),
    (re.compile(r"\bblock_bytes\b"), "--block-bytes"),
    (re.compile(r"\bmemory_limit\b"), "--memory-limit"),
    (re.compile(r"\bhalo=(\d+)"), r"--halo \1"),
    (re.compile(r"a smaller halo\b"), "a smaller --halo"),
    (re.compile(r"\bboundary='nearest', 'reflect' or 'periodic'"),
     "--boundary nearest, reflect or periodic"),
    (re.compile(r"\bboundary='(\w+)'"), r"--boundary \1"),
    (re.compile(r"\bboundary=([^\s:,;]+)"), r"--boundary \1"),
    (re.compile(r"^depth must be"), "--depth must be"),
    (re.compile(r"(\d+) inputs, (\d+) outputs, (\d+) args, then offset and n"),
     r"\1 inputs (-i), \2 outputs (-o), \3 --arg values, then offset and n"),
    (re.compile(r"(\d+) inputs, 1 partial buffer, (\d+) args, then offset and n"),
     r"\1 inputs (-i), 1 buffer for the per-element values, \2 --arg values, then offset "
     r"and n"),
    (re.compile(r"from args= or offset/n: list every buffer in inputs= or outputs="),
     "from --arg or offset/n: give every buffer as -i (or -o)"),
    (re.compile(r"^args\[\d+\]: (.+?) cannot be passed"), r"--arg \1 cannot be passed"),
    (re.compile(r"^args\[(\d+)\]: "), lambda m: f"--arg number {int(m.group(1)) + 1}: "),
    (re.compile(r"\btrace='([^']*)'"), r"--trace \1"),
    (re.compile(r"\btimeline\.plot\('([^']*)'\)"), r"--plot \1"),
    (re.compile(r"^timeline\.plot(?: needs|:)"), lambda m: m.group(0).replace(
        "timeline.plot", "--plot")),
    (re.compile(r"\bdevice=('[^']*')"), r"--device \1"),
    (re.compile(r"\bleave device= out\b"), "leave --device out"),
    (re.compile(r"stream them as separate inputs"),
     "give each as its own input: -i FILE:COLUMN"),
    # The command runs kernels only: it has no Python callable to reduce with.
    (re.compile(r"declare that buffer float\*\), or reduce with a Python callable"),
     "declare that buffer float*)"),
    # reduce= is --op (its values are the same words).
    (re.compile(r"\breduce='(\w+)'"), r"--op \1"),
    # --arg gives numbers only: the command has no way to pass an array or cv.resident.
    (re.compile(r"is a pointer \((.+?)\) but receives \w+ (.+?): pass an array \(uploaded "
                r"once, passed to every launch\) or cv\.resident\(array\)"),
     r"is a pointer (\1) but gets --arg \2: --arg passes numbers only; a buffer parameter "
     r"is filled by an -i or -o file (the kernel takes the inputs, then the outputs, then the "
     r"--arg values), and a whole array passed to every launch needs the Python API "
     r"(cv.stream(..., args=[array]))"),
]

_ASTYPE = re.compile(
    r"kernel parameter '(?P<param>\w+)' is (?P<type>.+?) but input (?P<index>\d+) has dtype "
    r"(?P<dtype>\w+): (?:pass an array of (?P<want>\w+) \(e\.g\. a\.astype\(np\.\w+\)\)"
    # A file given by path: validate._file_in_fix's copy of the file, which --cast replaces.
    r"|.+? holds \w+: write a copy of it as (?P<want_file>\w+) and pass that: np\.save\(.*?\)"
    r"(?= or declare the parameter |$))"
    r"(?: or declare the parameter (?P<declare>\S+))?"
)
# A complex input: Python's a.view(np.float32) is no option; the file can be written so.
_COMPLEX = re.compile(
    r"(?P<head>kernel parameter '\w+' is .+? but input \d+ has dtype complex\d+: kernels have "
    r"no complex type); pass a\.view\(np\.(?P<part>\w+)\), the real and imaginary parts "
    r"interleaved \(2 elements per value: offset and n count them\)"
)
# A file in the other byte order: --cast converts it as it is read (no rewrite needed).
_SWAPPED = re.compile(
    r"(?P<head>kernel parameter '(?P<param>\w+)' is \S+ \((?P<want>\w+)\) but input \d+ has "
    r"dtype \S+, not in this machine's byte order \(kernels read native order\): )"
    r"(?=rewrite the file|write its values)"
)
_INPUT_INDEX = re.compile(r"\binput (\d+)\b(?! \()")

# What a compiler prints on its own stderr besides the log conveyor already holds.
_COMPILER_SUMMARY = re.compile(r"^\d+ (?:errors?|warnings?)( and \d+ warnings?)? generated\.$")


def cli_terms(message: str, inputs: Sequence[str] = (), *, cluster: bool = False) -> str:
    """``message`` (one line) in the command's options; ``inputs`` are the ``-i`` texts.
    The user's file names in it are kept as written: the rules would rewrite a file named
    ``block_bytes.npy`` or ``input 1.npy`` as if it were conveyor's words. On a ``cluster``
    (--scheduler/--cluster, which take no --cast) a type's advice stays the library's: write
    a converted copy of the file."""
    # File-like names only: a bare "a" would be held inside the rules' own words ("pass an").
    names = sorted({n for text in inputs for n in (text, text.split(":", 1)[0])
                    if "." in n or "/" in n}, key=len, reverse=True)
    held = [n for n in names if n in message]
    for number, name in enumerate(held):
        message = message.replace(name, f"\0{number}\0")
    message = _terms(message, inputs, cluster)
    for number, name in enumerate(held):
        message = message.replace(f"\0{number}\0", name)
    return message


def _terms(message: str, inputs: Sequence[str], cluster: bool = False) -> str:
    if not cluster:
        message = _ASTYPE.sub(lambda m: _cast_advice(m, inputs), message)
    message = _COMPLEX.sub(lambda m: f"{m['head']} and --cast makes no real numbers of "
                                     f"complex ones: write the file as its real and imaginary "
                                     f"parts interleaved, np.save('parts.npy', "
                                     f"np.load('FILE').view(np.{m['part']})), and pass that "
                                     f"(2 elements per value)", message)
    if not cluster:
        message = _SWAPPED.sub(lambda m: f"{m['head']}add --cast {m['param']}:{m['want']} "
                                         f"(it converts the values as they are read), or ",
                               message)
    for pattern, replacement in _RULES:
        message = pattern.sub(replacement, message)

    def name_input(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return f"input {index} ({inputs[index]})" if index < len(inputs) else match.group(0)

    return _INPUT_INDEX.sub(name_input, message)


def _cast_advice(match: re.Match[str], inputs: Sequence[str]) -> str:
    index = int(match["index"])
    where = f" ({inputs[index]})" if index < len(inputs) else ""
    return (f"kernel parameter '{match['param']}' is {match['type']} but input {index}{where} "
            f"has dtype {match['dtype']}: add --cast "
            f"{match['param']}:{match['want'] or match['want_file']}, or "
            f"declare the parameter {match['declare'] or 'with that type'} in the kernel")


@contextlib.contextmanager
def compiler_output() -> Iterator[None]:
    """Pass what a compiler writes to the process's stderr (fd 2) while the block runs on to
    stderr as it comes, less the "N errors generated." summary lines of a log conveyor prints
    anyway (PoCL's Clang writes them straight to fd 2, ahead of the command's own message).

    As it comes: a compiler that ends the process mid-build (PoCL's LLVM: "LLVM ERROR: IO
    failure on output stream: File too large" under ``ulimit -f``, then exit(1)) left what it
    said in a held file that was never printed: exit 1 in silence. The lines go through a
    small filter process, not a thread: a thread dies with the process, and lost the race to
    exit(1) about once in 20 runs on a busy machine; the filter reads the pipe to its end.
    Where no filter can be started, the compiler writes to stderr itself, summary included.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        filter_ = _start_filter(saved)
        if filter_ is None or filter_.stdin is None:
            yield
            return
        os.dup2(filter_.stdin.fileno(), 2)
        filter_.stdin.close()  # fd 2 is the pipe's only writer now
        try:
            yield
        finally:
            os.dup2(saved, 2)  # the filter sees the pipe's end and exits
            try:
                filter_.wait(_FILTER_WAIT_S)  # its lines before the command's own message
            except subprocess.TimeoutExpired:  # a process the compiler started holds the
                pass  # pipe: the filter passes on what it says, and ends with it
    finally:
        os.close(saved)


def _start_filter(stderr: int) -> subprocess.Popen[bytes] | None:
    """The filter process, writing to the descriptor ``stderr``; None where no interpreter
    can be started (a frozen application, no processes left)."""
    if getattr(sys, "frozen", False) or not sys.executable:
        return None
    try:
        # Its own session: a Ctrl-C at the terminal is the command's alone, and the filter
        # ends when the pipe does, whoever holds it.
        return subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _FILTER, _COMPILER_SUMMARY.pattern],
            stdin=subprocess.PIPE, stdout=stderr, stderr=subprocess.DEVNULL,
            start_new_session=True)
    except OSError:
        return None


#: How long the end of a build waits for the filter to pass on the compiler's last lines.
_FILTER_WAIT_S = 10.0

#: The filter: stdin to stdout line by line as each comes, less the lines matching argv[1].
#: It reads to the end even once stdout fails, so the compiler's writes never fail.
_FILTER = """
import os, re, sys
summary = re.compile(sys.argv[1])
for line in sys.stdin.buffer:
    if summary.match(line.decode(errors="replace").strip()):
        continue
    try:
        while line:
            line = line[os.write(1, line):]
    except OSError:
        pass
"""
