"""Round thirty-seven: a review of session 20's last fixes (``git diff bb84539 2aa1ab6``).

Each finding was a strict xfail asserting the right behaviour. Fixed in session 20: the
advice for records given to a scalar pointer named the first field even where it was text
or a nested record, which does not convert (now the first numeric field). Fixed in session
21: one line holding an unclosed run of escaped quotes made the literal pattern of
``signature._NOT_CODE`` scan from each quote to the line's end (40 KB: 5.1 s); it is read in
one pass now (``signature._not_code``). The test runs under a 30 s SIGALRM, so that the old
behaviour (minutes) fails instead of hanging; one pass takes a fraction of a second.
"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, opencl_c_only  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError  # noqa: E402
from conveyor.kernels.preprocess import expand  # noqa: E402
from conveyor.kernels.signature import without_comments  # noqa: E402

SCALE = """__kernel void sc(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] * 2.0f;
}"""


# validate._array_fix advises the records' FIRST field, whatever it holds: a text field
# (np.ascontiguousarray(a['name'], dtype=np.float32): ValueError, could not convert string
# to float) or a nested struct (TypeError, cannot cast). A numeric field exists in both.
@pytest.mark.parametrize("first", [("name", "S8"), ("p", [("a", "f4"), ("b", "f4")])],
                         ids=["text", "nested"])
def test_advice_for_records_names_a_field_that_converts(device, first):
    opencl_c_only(device)
    k = device.compile(SCALE, "sc")
    a = np.zeros(16, [first, ("v", "f4")])
    a["v"] = np.arange(16)
    with pytest.raises(InputError) as info:
        cv.stream(k, [a], [np.float32], device=device)
    advised = re.search(r"np\.ascontiguousarray\(a\[.*?\], dtype=np\.\w+\)", str(info.value))
    assert advised, str(info.value)
    b = eval(advised.group(0), {"np": np, "a": a})  # the call the message advises
    out = cv.stream(k, [b], [np.float32], device=device).outputs[0]
    np.testing.assert_array_equal(out, 2 * a["v"])


class _Slow(Exception):
    pass


def _alarm(signum, frame):  # noqa: ANN001
    raise _Slow


# signature._NOT_CODE's string (and character) literal alternative, '"(?:\\.|[^"\\\n])*"',
# scans from each '"' of an unclosed line of escaped quotes ("\"\"\"...) to the line's end:
# quadratic (40 KB: 5 s in without_comments, again in code_only; 80 KB: 20 s through
# expand, 160 KB: 86 s). At this size it took minutes; one pass takes about 0.1 s.
# (The re engine checks signals, so the alarm ends it; 30 s is no timing of the good case.)
@pytest.mark.parametrize("quote", ['"', "'"])
def test_an_unclosed_line_of_escaped_quotes_is_read_in_one_pass(quote):
    hostile = "int k = 1; " + quote + ("\\" + quote) * 200_000 + "\n"
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, 30)
    try:
        assert without_comments(hostile) == hostile
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# --- What held (guards) -------------------------------------------------------------------

@pytest.mark.parametrize("source", [
    "/* c */ #define REAL /* a\n b */ double\nREAL x;\n",
    "/* a\n */ #define REAL /* b\n c */ double\nREAL x;\n",
    "  /**/#define REAL /* a\r\n b */ double\r\nREAL x;\r\n",
    "# /* a\n */ define REAL double\nREAL x;\n",
    "char s = '#'; /* a\n b */\n#define REAL /* a\n b */ double\nREAL x;\n",
])
def test_a_comment_before_a_directive_keeps_it_a_directive(source):
    """bb84539 read a line opening with a comment as code: REAL became nothing."""
    assert "double x;" in expand(source)
