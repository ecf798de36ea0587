from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

import pytest

from shared.paths import UnsafePath, safe_join, validate_relative_path


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("a", "a"),
        ("a/b.txt", "a/b.txt"),
        ("./a//b", "a/b"),
        ("a/./b/", "a/b"),
        ("data/train set.json", "data/train set.json"),
        ("ünïcode/数据.json", "ünïcode/数据.json"),
        ("..a/b..", "..a/b.."),  # dots inside a name are not a '..' component
        (".hidden", ".hidden"),
    ],
)
def test_valid_paths_are_normalised(raw: str, expected: str) -> None:
    result = validate_relative_path(raw)
    assert isinstance(result, PurePosixPath)
    assert result == PurePosixPath(expected)
    assert result.as_posix() == expected


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("", "empty"),
        (".", "folder itself"),
        ("./", "folder itself"),
        ("././/", "folder itself"),
        ("/etc/passwd", "absolute"),
        ("//server/share", "absolute"),
        ("..", "'..'"),
        ("../x", "'..'"),
        ("a/../../x", "'..'"),
        ("a/..", "'..'"),
        ("C:\\x", "backslash"),
        ("\\\\server\\share", "backslash"),
        ("a\\..\\b", "backslash"),
        ("C:/Windows", "drive letter"),
        ("c:x", "drive letter"),
        ("a\x00b", "control character"),
        ("a\nb", "control character"),
        ("a\rb", "control character"),
        ("a\x1b[31mred", "control character"),
        ("a\x7f", "control character"),
        ("a\x85b", "control character"),
    ],
)
def test_unsafe_paths_are_rejected_with_a_clear_message(raw: str, problem: str) -> None:
    with pytest.raises(UnsafePath) as info:
        validate_relative_path(raw)
    message = str(info.value)
    assert problem in message
    assert repr(raw) in message  # names the offending path
    assert isinstance(info.value, ValueError)


def test_non_string_is_rejected() -> None:
    with pytest.raises(UnsafePath, match="expected a string"):
        validate_relative_path(PurePosixPath("a"))  # type: ignore[arg-type]


def test_safe_join_returns_a_path_inside_root(tmp_path: Path) -> None:
    assert safe_join(tmp_path, "./a//b.txt") == tmp_path / "a" / "b.txt"
    # Nothing needs to exist yet: materialising a workspace joins paths before writing.
    assert safe_join(tmp_path / "not-yet", "x/y") == tmp_path / "not-yet" / "x" / "y"


def test_safe_join_rejects_what_validate_rejects(tmp_path: Path) -> None:
    for raw in ("../x", "/etc/passwd", "a\\b", ""):
        with pytest.raises(UnsafePath):
            safe_join(tmp_path, raw)


def test_safe_join_catches_a_symlinked_directory_pointing_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    outside = tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "escape").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePath, match="symlink") as info:
        safe_join(root, "escape/file.txt")
    assert str(outside) in str(info.value)
    # Nested: the link is deeper than the first component.
    (root / "sub").mkdir()
    (root / "sub" / "up").symlink_to("../../outside")
    with pytest.raises(UnsafePath):
        safe_join(root, "sub/up/x")


def test_safe_join_catches_a_final_symlink_pointing_out(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("no")
    (root / "data.json").symlink_to(secret)
    with pytest.raises(UnsafePath):
        safe_join(root, "data.json")


def test_safe_join_allows_symlinks_that_stay_inside(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "alias").symlink_to("real")
    assert safe_join(root, "alias/f.txt") == root / "alias" / "f.txt"


def test_safe_join_works_when_root_itself_is_a_symlink(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    assert safe_join(link, "a/b") == link / "a" / "b"


def test_safe_join_rejects_the_root_itself_through_a_link(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "self").symlink_to(".")
    with pytest.raises(UnsafePath):
        safe_join(root, "self")
    assert os.path.isdir(root / "self")
