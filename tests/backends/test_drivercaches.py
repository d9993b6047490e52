"""Where the OpenCL stack's own caches may go (backends/drivercaches.py): a folder conveyor
would keep binaries in, or none of them is used."""

from __future__ import annotations

import os

from conveyor.backends.drivercaches import unsafe_reason


def test_a_private_folder_and_one_not_made_yet_under_it_are_safe(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    assert unsafe_reason(str(home)) is None
    assert unsafe_reason(str(home / "not" / "made" / "yet")) is None


def test_folders_others_may_change_are_not(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # another user may write here
    assert "writable by group or others" in unsafe_reason(str(shared))
    assert "could rename" in unsafe_reason(str(shared / "cache"))  # made by a driver there
    afile = tmp_path / "home-is-a-file"
    afile.write_text("")
    assert "as a folder" in unsafe_reason(str(afile / ".cache"))
    assert "relative" in unsafe_reason(".cache")
    assert unsafe_reason(None) == "no cache folder"
    link = tmp_path / "link"
    os.symlink(shared, link)
    assert unsafe_reason(str(link)) is not None  # a link is judged as what it names
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.symlink(private, tmp_path / "to-private")
    assert unsafe_reason(str(tmp_path / "to-private")) is None
