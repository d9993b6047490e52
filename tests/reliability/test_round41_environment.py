"""Round forty-one: the environment as an attacker (or an odd machine) sets it.

Every ``CONVEYOR_*`` variable with hostile values; the kernel cache's folder (HOME, XDG,
``~``, read-only, made under a folder others may write), its entries and its descriptors;
the caches of what conveyor loads (PoCL's, PyOpenCL's) under the same variables; the
variables those read (``POCL_EXTRA_BUILD_FLAGS``, ``PYOPENCL_BUILD_OPTIONS``,
``OCL_ICD_VENDORS``, TMPDIR); the current folder removed; names that are not UTF-8 and a
standard output that cannot encode them; a file-size limit. Each finding is a strict xfail
asserting the right behaviour; real PoCL devices and compilers throughout, risky cases in
child processes.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import first_device_only, opencl_c_kernels  # noqa: E402, F401 (autouse)

import conveyor as cv  # noqa: E402
from conveyor import config  # noqa: E402
from conveyor.kernels import build  # noqa: E402

TWICE = """__kernel void twice(__global const float *a, __global float *out, ulong offset,
                    ulong n) {
    ulong i = get_global_id(0);
    if (i < n) out[i] = a[i] * 2.0f;
}
"""


def _twice_file(tmp_path: Path) -> tuple[Path, Path]:
    kernel = tmp_path / "k.cl"
    kernel.write_text(TWICE)
    x = tmp_path / "x.npy"
    np.save(x, np.arange(100, dtype=np.float32))
    return kernel, x


# -- POCL_EXTRA_BUILD_FLAGS: wrong answers ------------------------------------------------------
FACTOR_CHILD = """
import numpy as np, conveyor as cv
SRC = '''#ifndef FACTOR
#define FACTOR 3.0f
#endif
__kernel void scale(__global const float *a, __global float *out, ulong offset, ulong n) {
    ulong i = get_global_id(0);
    if (i < n) out[i] = a[i] * FACTOR;
}'''
dev = cv.device("SPEC")
a = np.ones(16, np.float32)
out = np.zeros_like(a)
cv.stream(dev.compile(SRC, "scale"), [a], [out], device=dev)
print(float(out[0]))
"""


def test_a_binary_built_under_pocl_extra_build_flags_is_not_served_without_them(device,
                                                                               tmp_path):
    # The class of PYOPENCL_BUILD_OPTIONS, fixed for that variable (test_security.py): PoCL
    # reads POCL_EXTRA_BUILD_FLAGS (strings of libpocl.so: a documented PoCL setting) and
    # appends its words to every clBuildProgram. conveyor's key (build.build_identity:
    # platform, device, driver, versions) holds nothing of it. A run with the flag stores
    # its binary; the next run without it loads that binary: every element 5.0 where the
    # source says 3.0, no error (in either order; uncached, each run is right). The key
    # should take the variable's words on a PoCL device, as it takes PyOpenCL's.
    if "Portable Computing Language" not in device.info.platform:
        pytest.skip("PoCL's variable")
    src = str(Path(cv.__file__).resolve().parents[1])
    env = dict(os.environ, CONVEYOR_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    for name in ("CONVEYOR_NO_CACHE", "POCL_EXTRA_BUILD_FLAGS", "PYOPENCL_BUILD_OPTIONS"):
        env.pop(name, None)
    code = FACTOR_CHILD.replace("SPEC", device.spec)

    def factor(**extra: str) -> float:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              timeout=120, env=dict(env, **extra))
        assert done.returncode == 0, done.stderr[-2000:]
        return float(done.stdout.split()[-1])

    assert factor(POCL_EXTRA_BUILD_FLAGS="-DFACTOR=5.0f") == 5.0
    assert factor() == 3.0


# -- standard output that cannot encode a name -----------------------------------------------
@pytest.mark.parametrize("encoding, name", [
    ("utf-8", os.fsdecode(b"y\xff.npy")),   # a Latin-1 name under en_US.UTF-8
    ("ascii", "y\u00e9.npy"),               # PYTHONIOENCODING=ascii
], ids=["non-utf8-bytes", "ascii-stdout"])
def test_the_command_writes_a_name_its_stdout_cannot_encode(device, tmp_path, monkeypatch,
                                                             encoding, name):
    # ``conveyor map ... -o $'y\xff.npy'`` on a desktop (en_US.UTF-8: stdout's errors are
    # 'strict', unlike C.UTF-8's surrogateescape), or any name beside PYTHONIOENCODING=ascii:
    # the stream and the rename succeed, then print(f"wrote {name}") raises
    # UnicodeEncodeError (a ValueError, which GuardedStdout and run() do not catch): a
    # traceback and exit 1 for a command that did its work. Same for `cache info` of such
    # a CONVEYOR_CACHE_DIR.
    from conveyor.cli import main

    kernel, x = _twice_file(tmp_path)
    out = tmp_path / name
    stdout = io.TextIOWrapper(io.BytesIO(), encoding=encoding, errors="strict")
    monkeypatch.setattr(sys, "stdout", stdout)
    code = main(["map", str(kernel), "--kernel", "twice", "-i", str(x), "-o", str(out),
                 "--device", device.spec])
    stdout.flush()
    assert code == 0
    assert b"wrote" in stdout.buffer.getvalue()
    np.testing.assert_array_equal(np.load(out), np.arange(100, dtype=np.float32) * 2)


def test_the_command_with_a_kernel_in_a_folder_named_in_latin1(device, tmp_path, monkeypatch,
                                                               capsys):
    # `conveyor map $'caf\xe9/k.cl' ...` (a folder named on a Latin-1 system), k.cl plain
    # UTF-8 with `#include "h.h"` beside it: anchor_includes (cli/streaming.py:154, 173)
    # writes the folder into the source's #include, then includes.included_headers does
    # source.encode() (kernels/includes.py:82): UnicodeEncodeError out of run(), a traceback.
    # Either the build works (the header found beside the file) or an InputError (exit 2)
    # says the folder's name is the trouble.
    from conveyor.cli import main

    folder = tmp_path / os.fsdecode(b"caf\xe9")
    folder.mkdir()
    (folder / "h.h").write_text("#define FACTOR 2.0f\n")
    kernel = folder / "k.cl"
    kernel.write_text('#include "h.h"\n' + TWICE.replace("* 2.0f", "* FACTOR"))
    _, x = _twice_file(tmp_path)
    out = tmp_path / "y.npy"
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(io.BytesIO(), encoding="utf-8",
                                                        errors="surrogateescape"))
    code = main(["map", str(kernel), "--kernel", "twice", "-i", str(x), "-o", str(out),
                 "--device", device.spec])
    err = capsys.readouterr().err
    if code == 0:
        np.testing.assert_array_equal(np.load(out), np.arange(100, dtype=np.float32) * 2)
    else:
        assert code == 2 and "k.cl" in err and "UTF-8" in err


def test_the_command_says_why_when_the_compiler_ends_the_process(device, tmp_path):
    # `ulimit -f 4` (or a full disk under POCL_CACHE_DIR): PoCL's LLVM cannot write its
    # kernel cache's .so and calls exit(1) after printing why on fd 2. The command holds
    # fd 2 in a temporary file while it builds (cli/words.py compiler_output, to drop
    # clang's "N errors generated." lines) and prints it in its `finally`, which an exit
    # from C never reaches: `conveyor map` exits 1 and prints nothing at all. Forwarding
    # the compiler's lines as they come (a pipe and a thread that drops only the summary
    # lines) would keep the reason. PoCL's own aborts (its cache's "Assertion 'len > 0'",
    # README) are hidden the same way.
    if "Portable Computing Language" not in device.info.platform:
        pytest.skip("PoCL's compiler")
    kernel, x = _twice_file(tmp_path)
    src = str(Path(cv.__file__).resolve().parents[1])
    env = dict(os.environ, CONVEYOR_NO_CACHE="1", POCL_CACHE_DIR=str(tmp_path / "pocl"),
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    done = subprocess.run(["/bin/sh", "-c", 'ulimit -f 4 && exec "$0" "$@"', sys.executable,
                           "-m", "conveyor", "map", str(kernel), "--kernel", "twice", "-i",
                           str(x), "-o", str(tmp_path / "y.npy"), "--device", device.spec],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode != 0  # the build cannot be written: a failure, rightly
    assert "File too large" in done.stderr


# -- a huge file under an entry's name ---------------------------------------------------------
@pytest.mark.skipif(Path("/proc/sys/vm/overcommit_memory").exists()
                    and Path("/proc/sys/vm/overcommit_memory").read_text().strip() == "1",
                    reason="with overcommit always on, reading the entry would not fail fast")
def test_a_huge_file_under_an_entry_name_is_a_miss_not_a_memory_error(device, tmp_path,
                                                                        monkeypatch):
    # KernelCache._read does f.read() of whatever regular file holds the name: 8 TiB (a
    # sparse file, no disk used) is a MemoryError out of Device.compile; 3 GiB read 3 GiB of
    # zeros into memory (9.8 s here) before the header check found it corrupt. The header
    # says the payload's length: a file of another size is corrupt without reading it.
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)
    build.clear_memo()
    try:
        cache = build.default_cache()
        assert cache is not None and cache.enabled
        entry = cache.entry_path(cache.key(device, TWICE, ()))
        with open(entry, "wb") as handle:
            handle.truncate(8 * 2**40)
        kernel = device.compile(TWICE, "twice")
        a = np.arange(64, dtype=np.float32)
        out = np.zeros_like(a)
        cv.stream(kernel, [a], [out], device=device)
        np.testing.assert_array_equal(out, a * 2)
        assert entry.stat().st_size < 2**30  # rebuilt over
    finally:
        build.clear_memo()


# -- the current folder removed ------------------------------------------------------------------
def test_a_relative_output_in_a_removed_current_folder_says_what_to_change(tmp_path,
                                                                           monkeypatch):
    # files.joined (files.py:204) calls os.getcwd() for a relative name; with the folder
    # gone, that is "[Errno 2] No such file or directory" and nothing else. The command says
    # "conveyor map: [Errno 2] No such file or directory: check the path and its
    # permissions" (exit 1) for -o y.npy. An InputError naming the output and the removed
    # current folder (give an absolute path) says what to change.
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(cv.InputError) as caught:
        cv.npy_out("y.npy", shape=(10,), dtype=np.float32)
    message = str(caught.value)
    assert "y.npy" in message and re.search(r"current (folder|directory)", message)


def test_the_command_in_a_removed_current_folder_names_what_is_gone(device, tmp_path,
                                                                    monkeypatch, capsys):
    from conveyor.cli import main

    kernel, x = _twice_file(tmp_path)
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    code = main(["map", str(kernel), "--kernel", "twice", "-i", str(x), "-o", "y.npy",
                 "--device", device.spec])
    err = capsys.readouterr().err
    assert code == 2
    assert "y.npy" in err and re.search(r"current (folder|directory)", err)


# -- "~" in CONVEYOR_CACHE_DIR ---------------------------------------------------------------------
@pytest.mark.parametrize("home", ["", "rel"], ids=["empty", "relative"])
def test_tilde_in_the_cache_variable_is_the_home_conveyor_uses(monkeypatch, home):
    # config._home() takes an empty or relative HOME as no HOME and asks the password
    # database (so the default cache is ~root/.cache/conveyor), but cache_dir() expands a
    # '~' in CONVEYOR_CACHE_DIR with Path.expanduser, which takes HOME='' as the home ''
    # ('~/c' -> '/c': as root, kernels are cached in a new folder at '/') and HOME='rel' as
    # 'rel/c' ("CONVEYOR_CACHE_DIR='~/c' must be an absolute path", where HOME is what is
    # wrong). One home for both: '~' is config._home().
    name = "r41-conveyor-cache-never-made"
    monkeypatch.setenv("HOME", home)
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", f"~/{name}")
    assert config.cache_dir() == config._home() / name


# -- a read-only cache ---------------------------------------------------------------------------
@pytest.fixture
def own_mount(tmp_path):
    """A small tmpfs of our own at ``tmp_path / "disk"`` (root only), unmounted after."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs",
                           str(disk)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_read_only_cache_of_ours_is_still_read(device, own_mount, monkeypatch):
    # README lists what refuses the cache folder (a link, another owner, group or other
    # write, an unsafe parent); open_private_dir (kernels/cachedir.py) also refuses one that
    # is "not writable" (os.access W_OK): a cache warmed at an image's build and mounted
    # read-only (or chmod 500, for a user) is never read: a warning, and every process
    # builds every kernel again (8.6% of a warm start on the H200, README's table). A
    # read-only cache of ours is as safe to read as a writable one; only stores cannot be
    # made. (As uid 65534 in a forked child, a 0500 folder of its own: the same refusal.)
    cache_dir = own_mount / "cache"
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(cache_dir))
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)
    build.clear_memo()
    try:
        device.compile(TWICE, "twice")  # warms it
        subprocess.run(["mount", "-o", "remount,ro", str(own_mount)], check=True)
        build.clear_memo()
        build._caches.pop(cache_dir, None)  # a new process's view of the folder
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            device.compile(TWICE, "twice")
        cache = build.default_cache()
        assert cache is not None and cache.hits == 1, [str(w.message) for w in record]
    finally:
        build.clear_memo()
        for path in [p for p in build._caches if own_mount in p.parents]:
            build._caches.pop(path).close()


# -- the cache folder made: chmod by name -------------------------------------------------------
def test_making_the_cache_folder_never_changes_a_file_a_link_names(device, tmp_path,
                                                                   monkeypatch):
    # CONVEYOR_CACHE_DIR under a folder another user can write (refused, but only after it
    # is made): cachedir.make_private_dirs does os.mkdir(d, 0o700) then os.chmod(d, 0o700).
    # Between the two, the other user renames the new folder away and puts a symlink to a
    # file of ours in its place; chmod follows it. As root, any file of the system: 0700.
    # The race is won here by a wrapper on the real os.mkdir, as an attacker's loop on
    # inotify would win it. fchmod on the folder opened O_NOFOLLOW | O_DIRECTORY, or
    # mkdir under a umask of 077, cannot be redirected.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # another user may write here
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    victim.chmod(0o644)
    cache = shared / "cache"
    real_mkdir = os.mkdir

    def mkdir_then_swapped(path, mode=0o777, *args, **kwargs):
        real_mkdir(path, mode, *args, **kwargs)
        if os.fspath(path) == str(cache):  # the attacker's move, right after ours
            os.rename(cache, shared / "moved")
            os.symlink(victim, cache)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swapped)
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(cache))
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)
    build.clear_memo()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the folder is refused, and says so
            device.compile(TWICE, "twice")
    finally:
        build.clear_memo()
    assert victim.stat().st_mode & 0o777 == 0o644


# -- one descriptor per cache folder ever named -------------------------------------------------
def test_cache_folders_of_past_jobs_hold_no_descriptor(tmp_path, monkeypatch):
    # A service that gives each job its own cache folder (CONVEYOR_CACHE_DIR=$JOB_TMP/cache,
    # removed after the job) and builds each job's kernel: 50 jobs held 51 more descriptors
    # (and 50 KernelCaches), device.compile included (/tmp script); past `ulimit -n` every
    # file and stream fails with EMFILE. A cache whose folder is gone, or is no longer the
    # configured one, should let its descriptor go (KernelCache._disable does not close it
    # either).
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)

    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "warm"))
    assert build.default_cache() is not None  # the module's own first-use costs, if any
    before = open_fds()
    jobs = 32
    try:
        for job in range(jobs):
            folder = tmp_path / f"job{job}" / "cache"
            monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(folder))
            cache = build.default_cache()
            assert cache is not None and cache.enabled  # what compile() does first
            cache.store("0" * 64, b"binary")
            shutil.rmtree(folder.parent)
        monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(tmp_path / "warm"))
        build.default_cache()
        assert open_fds() - before < jobs // 4
    finally:  # the rest of the suite gets its descriptors back
        for path in [p for p in build._caches if tmp_path in p.parents]:
            build._caches.pop(path).close()


# -- PYOPENCL_BUILD_OPTIONS ------------------------------------------------------------------
@pytest.mark.parametrize("value", ["-bogus", '-w"'])
def test_a_build_broken_by_pyopencl_build_options_names_the_variable(device, monkeypatch,
                                                                     value):
    # The user asked for no option; PyOpenCL appends the variable's words to every build
    # (conveyor knows: it keys the cache on them, config.pyopencl_build_options). The
    # CompileError says "OpenCL build failed ... Invalid build option: -bogus" and the
    # command exits 1 with the same: where the option came from is not said.
    monkeypatch.setenv("PYOPENCL_BUILD_OPTIONS", value)
    monkeypatch.setenv("CONVEYOR_NO_CACHE", "1")
    build.clear_memo()
    try:
        with pytest.raises(cv.CompileError) as caught:
            device.compile(TWICE, "twice")
    finally:
        build.clear_memo()
    assert "PYOPENCL_BUILD_OPTIONS" in str(caught.value)


def test_pyopencl_build_options_that_are_not_utf8_are_an_input_error(device, monkeypatch):
    # Round fifteen made a lone surrogate in a source, an option or a name an InputError;
    # the variable's words reach the same encode inside PyOpenCL (options.encode("utf-8"),
    # pyopencl/__init__.py) unchecked: `PYOPENCL_BUILD_OPTIONS=$'-I/data/caf\xe9' conveyor
    # map ...` prints PyOpenCL's traceback and exits 1. An InputError naming the variable.
    monkeypatch.setenv("PYOPENCL_BUILD_OPTIONS", os.fsdecode(b"-DX=caf\xe9"))
    monkeypatch.setenv("CONVEYOR_NO_CACHE", "1")
    build.clear_memo()
    try:
        with pytest.raises(cv.InputError, match="PYOPENCL_BUILD_OPTIONS"):
            device.compile(TWICE, "twice")
    finally:
        build.clear_memo()


# -- XDG_CACHE_HOME shared: PyOpenCL's own cache -------------------------------------------------
CHILD = f"""
import numpy as np, conveyor as cv
dev = cv.device("opencl:0:0")
k = dev.compile({TWICE!r}, "twice")
a = np.arange(64, dtype=np.float32)
out = np.zeros_like(a)
cv.stream(k, [a], [out], device=dev)
assert (out == a * 2).all()
"""


class _Planted:
    """What another user writes over a row of the shared folder: unpickling it runs their
    code, then gives the row's own value, so the victim's run goes on as if nothing
    happened."""

    def __init__(self, marker: str, row: bytes) -> None:
        self.marker, self.row = marker, row

    def __reduce__(self):
        return (eval, (f"(open({self.marker!r}, 'w').write('ran'), "
                       f"__import__('pickle').loads({self.row!r}))[1]",))


def test_a_shared_xdg_cache_home_runs_no_code_another_user_planted(device, tmp_path):
    # XDG_CACHE_HOME=/shared/cache (mode 0777, as on a CI box): conveyor warns and builds
    # uncached ("writable by group or others"), its promise being that nothing it runs comes
    # from a folder others may write, and that nothing on disk is pickled. But
    # pyopencl.invoker keeps a pytools WriteOncePersistentDict under
    # platformdirs.user_cache_dir("pytools") = $XDG_CACHE_HOME/pytools, read at every
    # pyopencl.Kernel made (each conveyor kernel load): its rows are pickles of marshalled
    # code. Another user who can write there replaces a row: the next conveyor process runs
    # their code. (PoCL's kcache/*.so, dlopen'ed, lands in $XDG_CACHE_HOME/pocl as well.)
    # A fix: pyopencl._PYOPENCL_NO_CACHE = True where conveyor loads PyOpenCL (conveyor's
    # own cache replaces it), and POCL_CACHE_DIR in a private folder.
    import pickle
    import sqlite3

    if any(d.backend == "cuda" for d in cv.devices()):
        pytest.skip("on the OpenCL devices of a CPU machine")
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # another user may write here
    src = str(Path(cv.__file__).resolve().parents[1])
    env = dict(os.environ, XDG_CACHE_HOME=str(shared),
               CONVEYOR_CACHE_DIR=str(tmp_path / "private"),
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    for name in ("CONVEYOR_NO_CACHE", "PYOPENCL_NO_CACHE", "POCL_CACHE_DIR", "HOME"):
        env.pop(name, None)
    env["HOME"] = str(tmp_path / "home")  # where nothing is planted

    def victim_runs() -> None:
        done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                              timeout=120, env=env)
        assert done.returncode == 0, done.stderr[-2000:]

    victim_runs()  # the victim's first run: what a planted row must look like
    marker = tmp_path / "planted-code-ran"
    tables = list(shared.glob("pytools/*invoker*"))
    for table in tables:  # the other user's move
        with sqlite3.connect(table) as db:
            for keyhash, row in db.execute("SELECT keyhash, key_value FROM dict").fetchall():
                db.execute("UPDATE dict SET key_value = ? WHERE keyhash = ?",
                           (pickle.dumps(_Planted(str(marker), row)), keyhash))
    victim_runs()  # the victim's next run, as before: right answers
    assert not marker.exists()


def test_a_relative_xdg_cache_home_puts_no_binary_in_the_current_folder(device, tmp_path):
    # Round fifteen kept conveyor's cache out of the current folder for a relative HOME and
    # XDG_CACHE_HOME (the XDG spec: ignore a relative value). PoCL takes XDG_CACHE_HOME as
    # it is: `cd ~/src/project && XDG_CACHE_HOME=.cache conveyor map ...` leaves
    # .cache/pocl/kcache/<hash>/twice/.../twice.so there, and a later run dlopens what that
    # folder holds (a checked-out tree's). conveyor could give PoCL a private
    # POCL_CACHE_DIR (under its own checked cache folder) when none is set.
    if any(d.backend == "cuda" for d in cv.devices()):
        pytest.skip("PoCL's cache, on a CPU machine")
    work = tmp_path / "project"
    work.mkdir()
    src = str(Path(cv.__file__).resolve().parents[1])
    env = dict(os.environ, XDG_CACHE_HOME="rel", CONVEYOR_CACHE_DIR=str(tmp_path / "private"),
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    for name in ("POCL_CACHE_DIR", "CONVEYOR_NO_CACHE"):
        env.pop(name, None)
    # Opening the device is enough: PoCL makes its folder then (a stream's first launch
    # writes the .so, 1.8 s more here).
    done = subprocess.run([sys.executable, "-c", "import conveyor as cv; cv.device('cpu')"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=work)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in work.iterdir()) == []


def test_a_home_that_is_a_file_is_named_not_install_pocl(device, tmp_path):
    # HOME=/srv/app.conf (a file), or a home the user cannot write (docker run -u 1000
    # with HOME=/): conveyor's own cache is refused with a warning and kernels build
    # uncached, as README says; but PoCL's clGetPlatformIDs fails ("Could not create top
    # directory .../.cache/pocl/kcache", POCL_DEBUG=all) and OpenCL lists nothing. With
    # POCL_CACHE_DIR set, PyOpenCL's invoker cache (pytools) then fails instead: "[Errno 20]
    # Not a directory: '<HOME>/.cache': check the path and its permissions", a path the
    # user never gave. Either the command runs (conveyor pointing PoCL at a private folder)
    # or it says HOME is what to change.
    if any(d.backend == "cuda" for d in cv.devices()):
        pytest.skip("on the OpenCL devices of a CPU machine")
    kernel, x = _twice_file(tmp_path)
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    src = str(Path(cv.__file__).resolve().parents[1])
    env = dict(os.environ, HOME=str(home), CONVEYOR_CACHE_DIR=str(tmp_path / "private"),
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    for name in ("XDG_CACHE_HOME", "POCL_CACHE_DIR", "CONVEYOR_DEVICE"):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "conveyor", "map", str(kernel), "--kernel",
                           "twice", "-i", str(x), "-o", str(tmp_path / "y.npy")],
                          capture_output=True, text=True, timeout=120, env=env)
    if done.returncode == 0:
        np.testing.assert_array_equal(np.load(tmp_path / "y.npy"),
                                      np.arange(100, dtype=np.float32) * 2)
    else:
        assert done.returncode == 2 and "HOME" in done.stderr, done.stderr


# -- TMPDIR --------------------------------------------------------------------------------------
def test_a_lock_folder_refused_under_tmpdir_names_tmpdir(tmp_path, monkeypatch):
    # CONVEYOR_NO_CACHE=1 TMPDIR=/shared/tmp (mode 0777): every build warns "the build-lock
    # folder /shared/tmp/conveyor-0-locks is inside /shared/tmp, which is writable by group
    # or others ...; keep the cache under folders only you (or root) can write; kernels are
    # built without it". The cache is off; the folder is TMPDIR's (buildlock.lock_dir), so
    # the advice is to set TMPDIR to a private folder (or enable the cache).
    from conveyor.kernels import buildlock

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("TMPDIR", str(shared))
    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    monkeypatch.setattr(buildlock, "_warned", set())
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        with buildlock.build_lock("k" * 64, None):
            pass
    said = [str(w.message) for w in record if "build-lock" in str(w.message)]
    assert len(said) == 1 and "TMPDIR" in said[0]


# -- OCL_ICD_VENDORS ------------------------------------------------------------------------------
def test_no_device_because_of_ocl_icd_vendors_names_the_variable(device, tmp_path):
    # conveyor's own advice for an unregistered NVIDIA library is `export
    # OCL_ICD_VENDORS=~/.icd` (diagnose.py); a folder that then lacks PoCL's .icd (or a
    # mistyped one) hides every OpenCL device, and `conveyor map` says to install PoCL, which
    # is installed (`conveyor devices`: "no device found: install ..."). conveyor reads the
    # variable (config.icd_vendor_dirs): the message should name it. In a child: the ICD
    # loader reads it once per process.
    if any(d.backend == "cuda" for d in cv.devices()):
        pytest.skip("CUDA's devices do not go through the OpenCL ICD loader")
    src = str(Path(cv.__file__).resolve().parents[1])
    env = dict(os.environ, OCL_ICD_VENDORS=str(tmp_path / "no-icd-here"),
               PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])))
    env.pop("CONVEYOR_DEVICE", None)
    kernel, x = _twice_file(tmp_path)
    done = subprocess.run([sys.executable, "-m", "conveyor", "map", str(kernel), "--kernel",
                           "twice", "-i", str(x), "-o", str(tmp_path / "y.npy")],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2
    assert "OCL_ICD_VENDORS" in done.stderr


# -- guards: what held ----------------------------------------------------------------------
#: Tried (with "\uff11", "inf", "1,000", "+1", "1.5", "\u200b1", "1G", "10**3", all refused):
#: Arabic-Indic digits, hex, NaN, underscores and an exponent past any memory.
HOSTILE = ["\u0663", "0x10", "nan", "1_000", "1e400"]
SIZED = {"CONVEYOR_POOL_KEEP": config.pool_keep, "CONVEYOR_PINNED_BUDGET": config.pinned_budget,
         "CONVEYOR_WARMUP": config.warmup_bytes}


@pytest.mark.parametrize("name", list(SIZED))
@pytest.mark.parametrize("value", HOSTILE)
def test_guard_hostile_sizes_are_refused_naming_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(cv.InputError, match=re.escape(name)):
        SIZED[name]()


def test_guard_a_fifo_as_the_cache_folder_is_refused_without_waiting(device, tmp_path,
                                                                     monkeypatch):
    # An open() of a FIFO waits for a writer; the cache opens its folder O_DIRECTORY, and a
    # build goes on uncached with one warning.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(fifo))
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)
    build.clear_memo()
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            kernel = device.compile(TWICE, "twice")
    finally:
        build.clear_memo()
    assert any("Not a directory" in str(w.message) for w in record)
    a = np.arange(32, dtype=np.float32)
    out = np.zeros_like(a)
    cv.stream(kernel, [a], [out], device=device)
    np.testing.assert_array_equal(out, a * 2)
