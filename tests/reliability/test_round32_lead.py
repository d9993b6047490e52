"""Session 20's own findings (beside round thirty-two's helpers), each seen failing first.

- **Refusal, and a wrong width on CUDA**: a ``typedef`` written over two lines
  (``typedef unsigned\\n  int count_t;``) was not read: the declarator's regular expression
  took its type with ``.``, which stops at a line break. On PoCL a ``count_t`` scalar was
  refused ("conveyor does not know this type"); on CUDA, where no driver names the type, an
  unresolved type takes a NumPy scalar of any size as given.
- **A slow read**: the same expression, a lazy type before a run of qualifiers, backtracked
  for seconds on a hostile ``typedef`` of 2,000 ``const`` words and an unclosed ``[`` (3.5 s
  on this machine for one statement). The declarator is read from its end in one pass now
  (``typedefs._declarator``). Three more expressions did the same: ``enum E : a`` followed by
  20,000 spaces and no ``{`` (4.6 s; 10.4 s after ``typedef``), ``using x = a`` and 20,000
  spaces (1.9 s), read with possessive quantifiers now; and a source read from a file whose
  ``#include`` is followed by 50,000 continued lines took 136 s to anchor its includes
  (each continued line was tried as a directive's start; it starts none).
- **A hang on a build error**: the expression that names the compiler's file for the
  source in a build log (``errors.name_source``) read a path before the name, so each
  position of a long word scanned to its end: a log quoting a 40,000-character source line
  took 136 s, a 200,000-character one would take an hour. The folders are found after the
  name now, from its end.
- **Not anchored**: ``#define \\`` continued onto the next line before its name left the
  header it names unanchored, so a header beside the kernel's file was looked for in the
  current directory (``includes._QUOTED_DEFINE``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, opencl_c_only, pocl_only  # noqa: E402, F401

import conveyor as cv  # noqa: E402
from conveyor.errors import InputError, name_source  # noqa: E402
from conveyor.kernels.includes import anchor_includes  # noqa: E402
from conveyor.kernels.signature import parse_params  # noqa: E402
from conveyor.kernels.typedefs import declared  # noqa: E402

TWO_LINES = """typedef
float real;
typedef unsigned
  int count_t;
__kernel void k32(__global const float *x, __global float *y, real s, count_t m, ulong offset,
                  ulong n)
{ size_t i = get_global_id(0); if (i < n) y[i] = x[i] * s + m; }
"""


def test_typedef_over_two_lines_streams(device):
    pocl_only(device)
    k = device.compile(TWO_LINES, "k32")
    x = np.arange(10, dtype=np.float32)
    y = np.zeros_like(x)
    cv.stream(k, [x], [y], device=device, args=(np.float64(2.0), 3), block_bytes=16)
    np.testing.assert_array_equal(y, x * 2 + 3)


def test_cuda_typedef_over_two_lines_is_read_as_its_type():
    read = parse_params('typedef unsigned\nlong long u64;\ntypedef\r\nfloat\treal;\n'
                        'extern "C" __global__ void k(real *o, u64 n, real w) {}', "k")
    assert [(p.name, p.is_pointer, str(p.dtype)) for p in read] == [
        ("o", True, "float32"), ("n", False, "uint64"), ("w", False, "float32")]


def test_hostile_typedef_is_read_in_one_pass():
    """Not a timing: 20,000 ``const`` words took the old expression minutes, so a return to
    it shows as this test hanging."""
    assert declared("typedef float " + "const " * 20000 + "x[;") == {}
    many = declared("typedef float " + "const " * 20000 + "x;")
    assert list(many) == ["x"] and many["x"].split() == ["float"] + ["const"] * 20000
    assert declared("typedef float const * restrict const p, q[4];") == {
        "p": "float const *", "q": "float const []"}


def test_hostile_enum_and_using_declarations_are_read_in_one_pass():
    """Not a timing: at these sizes the old expressions took minutes."""
    spaces = " " * 200_000
    assert declared(f"enum E : a{spaces}b") == {}
    assert declared(f"typedef enum E : a{spaces}b") == {}
    assert declared(f"using x = a{spaces}b") == {}
    assert declared("typedef enum E : unsigned  short { A } e16; using fp = float *"
                    " __restrict__ ; enum F : long long\n{ B };") == {
        "e16": "unsigned short", "enum E": "unsigned short", "fp": "float * __restrict__",
        "enum F": "long long"}


def test_continued_lines_start_no_directive(tmp_path):
    (tmp_path / "h.h").write_text("#define K 1\n")
    many = "#include" + "\\\n" * 50_000 + "x"
    assert anchor_includes(many, tmp_path) == many
    head = str(tmp_path / "h.h")
    assert anchor_includes('x \\\n#include "h.h"\n', tmp_path) == 'x \\\n#include "h.h"\n'
    assert anchor_includes('#define \\\nH "h.h"\n#include H\n', tmp_path) == (
        f'#define \\\nH "{head}"\n#include H\n')
    assert anchor_includes('#include \\\n "h.h"\n', tmp_path) == f'#include \\\n "{head}"\n'


def test_a_build_log_quoting_a_long_line_is_named_in_one_pass():
    """Not a timing: a 200,000-character word took the old expression about an hour."""
    for word in ("a/" * 100_000, "x" * 200_000, "tempfile_" * 20_000):
        log = f"/tmp/kcache/tempfile_Ab1.cl:1:7: error: {word}\n"
        assert name_source(log, "k.cl") == f"k.cl:1:7: error: {word}\n"
    log = ('/tmp/pocl/tempfile_AbC.cl:3:5: error: x\nin the compilation of "default_program"\n'
           "default_program(4): error\n<kernel>:2:1: w\n/opt/rocm/CompileSource:5:1 y.cl: no")
    assert name_source(log, "k.cl") == ('k.cl:3:5: error: x\nin the compilation of "k.cl"\n'
                                        "k.cl(4): error\nk.cl:2:1: w\nk.cl:5:1 y.cl: no")


def test_the_command_is_not_told_to_reduce_with_a_python_callable():
    """``conveyor reduce`` runs kernels only: the library's advice for a dtype the built-in
    fold does not take ("or reduce with a Python callable") is left out of its message."""
    from conveyor.cli.words import cli_terms

    said = cli_terms("cannot reduce elements of dtype float16 on the device (the built-in fold "
                     "takes bool, float32): have the kernel write its values as float32 "
                     "(declare that buffer float*), or reduce with a Python callable", ())
    assert said.endswith("(declare that buffer float*)") and "callable" not in said


# -- the command line: --halo for reduce, --boundary for both (missing until session 20) ----------
STEN = """__kernel void sten(__global const float *x, __global float *y, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) y[i] = x[i] - 2.0f * x[i + 1] + 4.0f * x[i + 2];
}
"""


def _padded(x: np.ndarray, boundary) -> np.ndarray:
    if isinstance(boundary, str):
        mode = {"nearest": "edge", "reflect": "symmetric", "periodic": "wrap"}[boundary]
        p = np.pad(x, 1, mode=mode)  # type: ignore[call-overload]
    else:
        p = np.pad(x, 1, mode="constant", constant_values=boundary)
    return p[:-2] - 2 * p[1:-1] + 4 * p[2:]


def test_the_command_takes_a_boundary_and_a_reduction_takes_a_halo(device, tmp_path, capsys):
    from conveyor.cli import main

    opencl_c_only(device)
    (tmp_path / "k.cl").write_text(STEN)
    x = np.arange(11, dtype=np.float32) ** 2 - 30
    np.save(tmp_path / "x.npy", x)
    common = [str(tmp_path / "k.cl"), "--kernel", "sten", "-i", str(tmp_path / "x.npy"),
              "--device", device.spec, "--halo", "1", "--block-bytes", "16", "--no-progress"]
    for boundary in ("nearest", "reflect", "periodic", "-4", "2.5"):
        out = tmp_path / f"y{boundary}.npy"
        assert main(["map", *common, "--boundary", boundary, "-o", str(out)]) == 0
        value = boundary if boundary[0].isalpha() else float(boundary)
        np.testing.assert_array_equal(np.load(out), _padded(x, value))
        capsys.readouterr()
        assert main(["reduce", *common, "--boundary", boundary, "--op", "max", "-q"]) == 0
        assert float(capsys.readouterr().out) == _padded(x, value).max()
    with pytest.raises(SystemExit) as usage:  # argparse's exit for bad usage
        main(["map", *common, "--boundary", "wrap", "-o", str(tmp_path / "w.npy")])
    assert usage.value.code == 2
    assert "'wrap': give nearest, reflect, periodic" in capsys.readouterr().err
    assert main(["map", *common, "--boundary", "1e40", "-o", str(tmp_path / "b.npy")]) == 2
    said = capsys.readouterr().err
    assert "--boundary 1e+40" in said and "boundary=" not in said, said
    assert not (tmp_path / "w.npy").exists() and not (tmp_path / "b.npy").exists()


def test_a_boundary_past_float64_is_refused_by_the_command(tmp_path, capsys):
    # "1e400" was read as inf (float("1e400")), where the library refuses a finite number
    # past float64's range; "inf" itself is a constant the pad rows hold
    from conveyor.cli import main

    for text in ("1e400", "-1e400"):
        with pytest.raises(SystemExit) as usage:
            main(["map", str(tmp_path / "k.cl"), "--kernel", "k", "-i", "x.npy", "-o",
                  str(tmp_path / "y.npy"), f"--boundary={text}"])
        assert usage.value.code == 2
        assert f"'{text}' lies past float64's range" in capsys.readouterr().err
    from conveyor.cli.parser import _boundary

    assert _boundary("-inf") == float("-inf") and _boundary("1e-400") == 0.0


def test_a_bool_boundary_is_told_its_number():
    with pytest.raises(InputError, match=r"boundary=True \(a bool is no constant: pass 1"):
        cv.stream(lambda x, y: None, [np.zeros(4, np.float32)], [np.float32], halo=1,
                  boundary=True)
