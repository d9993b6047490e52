"""Round forty-two: a review of round forty-one's environment and command-line fixes.

backends/drivercaches.py (PoCL's and PyOpenCL's caches moved out of unsafe folders), the
no-device diagnosis (backends/diagnose.py), and the current folder removed under the
preprocessor. Each finding is a strict xfail asserting the right behaviour; real PoCL
devices throughout; what touches the environment runs in a child interpreter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # reliakit
from reliakit import child_env, first_device_only, opencl_c_kernels  # noqa: E402, F401

import conveyor as cv  # noqa: E402

SRC = str(Path(cv.__file__).resolve().parents[1])


def _child(code: str, tmp_path: Path, drop: tuple[str, ...] = (), cwd: Path | None = None,
           **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with ``env`` set and ``drop`` unset."""
    full = child_env(SRC)
    for name in ("XDG_CACHE_HOME", "POCL_CACHE_DIR", "PYOPENCL_NO_CACHE", "CONVEYOR_DEVICE",
                 *drop):
        full.pop(name, None)
    full.setdefault("CONVEYOR_CACHE_DIR", str(tmp_path / "conveyor-cache"))
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env=full, cwd=cwd or tmp_path)


def _pocl_only() -> None:
    if any(d.backend == "cuda" for d in cv.devices()):
        pytest.skip("PoCL's cache, on a CPU machine")


# -- the private PoCL folder: removed by a forked child --------------------------------------
FORKED = """
import os, sys, numpy as np, conveyor as cv
dev = cv.device("opencl:0:0")
folder = os.environ["POCL_CACHE_DIR"]  # the 0700 temporary folder conveyor made
pid = os.fork()
if pid == 0:
    sys.exit(0)  # a child that ends through the interpreter: atexit runs
os.waitpid(pid, 0)
print("exists", os.path.isdir(folder))
k = dev.compile('''__kernel void k(__global const float *a, __global float *out, ulong offset,
                   ulong n) { ulong i = get_global_id(0); if (i < n) out[i] = a[i] * 3.0f; }''',
                "k")
a = np.arange(64, dtype=np.float32)
out = np.zeros_like(a)
cv.stream(k, [a], [out], device=dev)
assert (out == a * 3).all()
print("built")
"""


def test_a_forked_child_that_exits_keeps_the_parents_pocl_folder(device, tmp_path):
    # XDG_CACHE_HOME relative (or shared) and no usable conveyor cache: guard() gives PoCL a
    # mkdtemp folder and registers shutil.rmtree for it with atexit. A child made by
    # os.fork() inherits that registration; when it ends through the interpreter (sys.exit,
    # falling off the end of a script) it removes the folder the parent's PoCL still uses,
    # and every later build in the parent is "OpenCL build failed on pthread-...: Device
    # ... failed to build the program", naming nothing to change.
    _pocl_only()
    work = tmp_path / "work"
    work.mkdir()
    done = _child(FORKED, tmp_path, cwd=work, XDG_CACHE_HOME="rel", CONVEYOR_NO_CACHE="1")
    assert done.returncode == 0 and "exists True" in done.stdout, done.stderr[-1500:]
    assert "built" in done.stdout


# -- false alarms: a cache folder reached through a symlink ------------------------------------
GUARD = """
import os, pyopencl
from conveyor.backends import drivercaches
print("why", drivercaches.guard())
print("pocl", os.environ.get("POCL_CACHE_DIR"))
print("nocache", pyopencl._PYOPENCL_NO_CACHE)
"""


def _guarded(tmp_path: Path, **env: str) -> dict[str, str]:
    done = _child(GUARD, tmp_path, **env)
    assert done.returncode == 0, done.stderr[-1500:]
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


@pytest.mark.parametrize("linked", ["cache", "home"])
def test_a_private_cache_home_through_a_symlink_changes_nothing(tmp_path, linked):
    # ~/.cache -> /data/me/cache (a home on a small disk), or HOME=/home/me -> /mnt/me with
    # no ~/.cache yet: folders only this user can write. conveyor's own cache takes
    # ~/.cache/conveyor there (a symlink is refused only as the cache folder itself), yet
    # guard() calls the drivers' folder unsafe ("cannot be opened as a folder (Not a
    # directory)"): PyOpenCL's caches are turned off for the whole process (the user's own
    # pyopencl programs too) and POCL_CACHE_DIR is set (inherited by every child process),
    # moving PoCL's cache to ~/.cache/conveyor/pocl: through the very link it refused.
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    if linked == "cache":
        home = tmp_path / "home"
        home.mkdir(mode=0o700)
        (home / ".cache").symlink_to(real)
    else:
        home = tmp_path / "home-link"
        home.symlink_to(real)
    seen = _guarded(tmp_path, drop=("CONVEYOR_CACHE_DIR",), HOME=str(home),
                    CONVEYOR_CACHE_DIR="")
    assert seen == {"why": "None", "pocl": "None", "nocache": "False"}, seen


def test_guard_a_trailing_slash_or_dotdot_in_a_private_xdg_cache_home_changes_nothing(
        tmp_path):
    # Held: Path() drops the trailing slash; '..' is left to the kernel. (A false alarm here
    # would turn PyOpenCL's caches off for every such user.)
    base = tmp_path / "xdg"
    base.mkdir(mode=0o700)
    (base / "sub").mkdir(mode=0o700)
    for given in (f"{base}/", f"{base}/sub/..", f"{base}/missing/../new"):
        assert _guarded(tmp_path, XDG_CACHE_HOME=given)["why"] == "None", given


# -- unsafe setups missed: the drivers' own subfolders -----------------------------------------
@pytest.mark.parametrize("sub", ["pytools", "pocl"])
def test_a_shared_drivers_folder_under_a_private_cache_home_is_guarded(tmp_path, sub):
    # XDG_CACHE_HOME is ours and 0700, but its pytools/ (PyOpenCL's pickled invoker rows,
    # round forty-one's planted-code test) or pocl/ (PoCL's kcache/*.so, dlopen'ed) is a
    # symlink to a team's shared 0777 folder, or was made 0777: another user writes code this
    # process runs. guard() says nothing is wrong, and changes nothing.
    base = tmp_path / "xdg"
    base.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (base / sub).symlink_to(shared)
    seen = _guarded(tmp_path, XDG_CACHE_HOME=str(base))
    assert seen["why"] != "None", seen
    assert seen["nocache"] == "True" if sub == "pytools" else seen["pocl"] != "None", seen


# -- refusals: a home the user cannot write ------------------------------------------------------
@pytest.fixture
def read_only_home(tmp_path):
    """A read-only tmpfs at ``tmp_path / "home"`` (root only), unmounted after: a HOME this
    process cannot write, as HOME=/ is for ``docker run -u 1000``."""
    home = tmp_path / "home"
    home.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,mode=0755,ro", "tmpfs",
                           str(home)], capture_output=True, text=True)
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield home
    finally:
        subprocess.run(["umount", "-l", str(home)], capture_output=True)


def test_a_home_the_user_cannot_write_still_has_pocls_device(device, tmp_path,
                                                             read_only_home):
    # docker run -u 1000 (HOME=/), or a read-only home: conveyor's own cache (here in
    # CONVEYOR_CACHE_DIR) is fine, and guard() could give PoCL a private folder as it does
    # for a HOME that is a file (or a relative XDG_CACHE_HOME). It does not: unsafe_reason
    # finds the home's folders safe, PoCL cannot make HOME/.cache/pocl, and cv.device()
    # says "no compute device found: ... set HOME to a folder you can write, or
    # POCL_CACHE_DIR" (named, but legal work refused).
    _pocl_only()
    done = _child("import conveyor as cv; print(cv.device('cpu').spec)", tmp_path,
                  HOME=str(read_only_home))
    assert done.returncode == 0, done.stderr[-1500:]


# -- no device: a setting that hides installed devices -------------------------------------------
def test_pocl_devices_naming_no_device_is_what_the_message_names(device, tmp_path):
    # POCL_DEVICES=cuda (a PoCL without that driver), or a typo (POCL_DEVICES=pthreads):
    # PoCL lists nothing, and the message advises installing PoCL, which is installed.
    _pocl_only()
    done = _child("import conveyor as cv; cv.device(None)", tmp_path,
                  POCL_DEVICES="pthreads")
    assert done.returncode == 1 and "no compute device found" in done.stderr, done.stderr
    assert "POCL_DEVICES" in done.stderr, done.stderr[-600:]


# -- the current folder removed: the preprocessor -----------------------------------------------
def test_the_preprocessor_without_a_current_folder_expands_once_back_in_one(tmp_path):
    # `conveyor map /abs/k.cl -i /abs/x.npy -o /abs/y.npy` run from a folder another shell
    # removed (every path absolute, as round forty-one's message advises): "warning:
    # conveyor's preprocessor could not expand a kernel source ([Errno 2] No such file or
    # directory): its parameter types are read unexpanded". The cause is pcpp's constructor
    # (rewrite_paths = abspath('')); the result is memoized, so the source stays unexpanded
    # for the process even after a cd back.
    from conveyor.kernels import preprocess

    source = ("#define T float\n__kernel void f(__global T *a, ulong offset, ulong n) {}\n"
              f"// {tmp_path}\n")
    # pcpp cannot start without a current folder (its constructor asks for it): the warning
    # says so, and the failure is not memoized, so the source is expanded once the process
    # is in a folder again.
    here = os.getcwd()
    gone = tempfile.mkdtemp(dir=tmp_path)
    os.chdir(gone)
    try:
        os.rmdir(gone)
        text, expanded = preprocess.expand_checked(source)
    finally:
        os.chdir(here)
    assert not expanded
    text, expanded = preprocess.expand_checked(source)
    assert expanded and "__global float *a" in text


# -- the kernel cache's folder removed while the process runs ------------------------------------
def test_a_cache_folder_removed_by_hand_is_made_again_not_off_for_good(device, tmp_path,
                                                                      monkeypatch):
    # A long-lived process (a notebook, a service) and `rm -rf ~/.cache/conveyor` in a
    # shell (to free space, or as a clean slate): the next build warns "kernel cache
    # directory ... cannot be checked (No such file or directory); kernels are compiled
    # without a disk cache", and no kernel is stored again until the process restarts,
    # though a new folder could be made (a first use makes it). Round forty-one's
    # KernelCache.removed() sees exactly this, but default_cache() asks it only of the
    # caches of other paths.
    import warnings

    from conveyor.kernels import build

    folder = tmp_path / "cache"
    monkeypatch.setenv("CONVEYOR_CACHE_DIR", str(folder))
    monkeypatch.delenv("CONVEYOR_NO_CACHE", raising=False)
    source = "__kernel void k%d(__global float *a, ulong offset, ulong n) { }"
    build.clear_memo()
    try:
        device.compile(source % 1, "k1")
        shutil.rmtree(folder)
        build.clear_memo()
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            device.compile(source % 2, "k2")
        cache = build.default_cache()
        assert cache is not None and cache.enabled, [str(w.message) for w in record]
        assert len(list(folder.glob("*.bin"))) == 1  # k2, stored in the folder made again
    finally:
        build.clear_memo()
        cache = build._caches.pop(folder, None)
        if cache is not None:
            cache.close()
