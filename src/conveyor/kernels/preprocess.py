"""Expand a kernel's source with a C preprocessor before its parameter list is read.

A kernel may spell its parameter types with macros (``#define T float`` ... ``const T *x``),
or choose them with ``-D`` options and ``#if``; reading the raw text would take ``T`` for an
unknown type and let any dtype through. NVRTC reports no parameter types, so on CUDA the
expanded text is what conveyor reads (cross-checked against the loaded kernel's argument
sizes); on OpenCL the driver's own report comes first and the expanded text only resolves
typedef names and stands in where a driver reports nothing.

The preprocessor is pcpp (pure Python). Headers it cannot find (the compiler's own, such as
``cuda_fp16.h``) are left as they are; a source it cannot expand is read unexpanded.
"""

from __future__ import annotations

import functools
import io
import re
from collections.abc import Sequence
from typing import Any

from conveyor.kernels.argtypes import warn_once as _warn_once
from conveyor.kernels.includes import include_dirs
from conveyor.kernels.signature import without_comments


def expand(source: str, options: Sequence[str] = (), macros: tuple[tuple[str, str], ...] = (),
           ) -> str:
    """``source`` with its macros expanded and its ``#if`` branches chosen.

    ``options`` are the build options (their ``-D`` and ``-I`` are honoured); ``macros`` are
    what the device's compiler predefines (``Device.source_macros``). Returns ``source``
    unchanged (with a warning, once) when pcpp is missing or fails on it.
    """
    return expand_checked(source, options, macros)[0]


def expand_checked(source: str, options: Sequence[str] = (),
                   macros: tuple[tuple[str, str], ...] = (), headers: str = ""
                   ) -> tuple[str, bool]:
    """:func:`expand`, and whether it expanded (False: ``source`` came back unexpanded, so
    what is read from it must not be kept as if it had been: the kernel cache's ``.sig``).
    ``headers`` names the contents of the headers the source includes (the kernel cache key
    covers them): the expansions are memoized, and an edited header must not be served the
    expansion of its old text."""
    try:
        return _expand(source, tuple(options), tuple(macros), headers)
    except _NoCurrentFolder:
        # Not memoized: the same source is expanded once the process is in a folder again.
        _warn_once("conveyor's preprocessor could not expand a kernel source: the current "
                   "folder no longer exists (pcpp asks for it), so its parameter types are "
                   "read unexpanded: cd to a folder that exists")
        return source, False


class _NoCurrentFolder(Exception):
    """pcpp could not start: the process's current folder was removed."""


@functools.lru_cache(maxsize=256)
def _expand(source: str, options: tuple[str, ...], macros: tuple[tuple[str, str], ...],
            headers: str = "") -> tuple[str, bool]:
    try:
        from pcpp.preprocessor import Action, OutputDirective, Preprocessor
    except ImportError:  # pragma: no cover - pcpp is a dependency
        _warn_once("pcpp is not installed: kernel parameter types are read from the source "
                   "without expanding its macros (pip install pcpp)")
        return source, False

    class _Quiet(Preprocessor):
        """pcpp that passes unknown headers through and keeps its complaints to itself."""

        def on_include_not_found(self, is_malformed: bool, is_system_include: bool,
                                 curdir: str, includepath: str) -> Any:
            raise OutputDirective(Action.IgnoreAndPassThrough)

        def on_error(self, file: str, line: int, msg: str) -> None:
            self.return_code += 1

        def on_directive_unknown(self, directive: Any, toks: Any, ifpassthru: Any,
                                 precedingtoks: Any) -> Any:
            # #error / #warning belong to the real compiler; #pragma and the rest pass through.
            return True if directive.value in ("error", "warning") else None

    try:
        try:
            pre = _Quiet()
        except FileNotFoundError:  # its os.path.abspath(''): no current folder
            raise _NoCurrentFolder() from None
        pre.line_directive = None
        words = [word for option in options for word in option.split()]
        implied = [("__FAST_RELAXED_MATH__", "1")] if "-cl-fast-relaxed-math" in words else []
        std = next((w[len("-cl-std=CL"):] for w in words if w.startswith("-cl-std=CL")), "")
        if re.fullmatch(r"\d\.\d", std):  # -cl-std=CL3.0: the compiler's __OPENCL_C_VERSION__
            implied.append(("__OPENCL_C_VERSION__", str(int(std[0]) * 100 + int(std[2]) * 10)))
        for name, value in (*macros, *implied, *_defines(options)):
            pre.define(f"{name} {value}")
        for path in include_dirs(options):  # the directories the cache key follows too
            pre.add_path(str(path))
        # C joins a line ending in a backslash to the next before it finds comments (phase 2):
        # "// note \" makes the next line a comment too, which pcpp read as code.
        pre.parse(collapse_tables(without_comments(re.sub(r"\\\r?\n", "", source))),
                  "kernel")
        out = io.StringIO()
        pre.write(out)
    except _NoCurrentFolder:
        raise
    except Exception as exc:  # pcpp fails on some inputs: read the unexpanded source
        _warn_once(f"conveyor's preprocessor could not expand a kernel source ({exc}): its "
                   f"parameter types are read unexpanded")
        return source, False
    return out.getvalue(), True


#: An initializer ``= { ... };`` whose text holds none of ``; # " ' / =``: a candidate table.
_INITIALIZER = re.compile(r"=\s*\{([^;#\"'/=]*)\}(?=\s*;)")
#: A C preprocessing number (C11 6.4.8): no macro is ever expanded inside one.
_PP_NUMBER = re.compile(r"\.?\d(?:[eEpP][+-]|[\w.])*")
#: Initializers shorter than this are left to pcpp as they are.
TABLE_CHARS = 4096


def collapse_tables(source: str) -> str:
    """``source`` with each long initializer made only of numbers (``= {1.5f, -2, 0x1F};``,
    nested braces too) cut to ``= {0};`` and its line breaks, before pcpp reads it.

    pcpp tokenizes in Python: a 1.6 MB ``__constant`` lookup table took it 4 s here (17 s
    for another), though no macro can hide in such a table (its tokens are preprocessing
    numbers, signs, commas and braces) and nothing conveyor reads from the expanded text
    (parameters, typedefs, struct layouts, kernel names) lies inside an initializer. Line
    numbers stay as they were."""
    def cut(match: re.Match[str]) -> str:
        body = match.group(1)
        if len(body) < TABLE_CHARS or body.count("{") != body.count("}"):
            return match.group(0)
        if not re.fullmatch(r"[\s,{}+\-]*", _PP_NUMBER.sub("", body)):
            return match.group(0)  # a name in it: a macro pcpp must see
        # Every line break as it was (a lone "\r" is one to pcpp and the compiler too):
        # __LINE__ after the table, and an #if on it, read as the compiler reads them.
        return "= {0" + "".join(re.findall(r"\r\n|\r|\n", body)) + "}"

    return _INITIALIZER.sub(cut, source)


def _defines(options: tuple[str, ...]) -> list[tuple[str, str]]:
    """The ``-D NAME[=VALUE]`` of a build's options (joined or separate), as (NAME, VALUE):
    ``-DX`` defines X as 1 and ``-DX=`` as nothing, as C compilers do."""
    defines: list[tuple[str, str]] = []
    # PyOpenCL joins the options with spaces and the driver splits them at spaces: "-w -DX"
    # (one option) defines X, and "-DA=1 -DB" defines A and B. (A separate "-D" takes the
    # next word.)
    words = [word for option in options for word in option.split()]
    items = iter(words)
    for item in items:
        option = item + next(items, "") if item == "-D" else item
        if option.startswith("-D") and len(option) > 2:
            name, equals, value = option[2:].strip().partition("=")  # "-D T=double" too
            defines.append((name, value if equals else "1"))
    return defines
