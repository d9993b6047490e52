"""An output file larger than the disk (here: the process's file size limit) can hold: an
OSError naming the reason, not a crash, and nothing left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def test_an_output_larger_than_the_file_size_limit_fails_and_leaves_nothing(tmp_path):
    """EFBIG here (ENOSPC on a full disk) at the first write past the limit, raised from the
    staging thread as is; the part file is deleted and no output appears."""
    script = textwrap.dedent(f"""
        import errno, resource, signal, sys
        import numpy as np
        import conveyor as cv
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # past the limit: EFBIG, not a signal
        resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, 2**20))
        x = np.ones(2**20, np.float32)  # 4 MiB out
        try:
            cv.stream(lambda x, y: y.__setitem__(slice(None), x), [x],
                      [cv.raw_out({str(tmp_path / "y.bin")!r}, np.float32)],
                      block_bytes=2**19)
        except OSError as exc:
            print("OSError", errno.errorcode[exc.errno])
            sys.exit(0)
        print("no error")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "OSError EFBIG", done.stdout + done.stderr
    assert list(tmp_path.iterdir()) == []
