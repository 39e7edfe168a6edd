"""Output paths checked against input paths before a tool does any work.

The Python tools' counterpart of CheckOutputPaths (base/file.h): an output
that names an input (however the path is spelled: links, hard links, "..")
or another output is refused, and so is one that cannot be created, so a
run never destroys what it was handed and never learns at its end that it
cannot write its result. Standard library only: the tools that import it
need nothing else.
"""
import os


class OutputPathError(ValueError):
    """An output path that would overwrite an input or cannot be written."""


def _named(path):
    return path is not None and path not in ("", "-")


def same_file(a, b):
    """Whether paths a and b name one file: by device and inode where both
    exist, else by their normalised absolute paths (symlinks resolved)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_writable(path):
    """Raises OutputPathError unless a file can be created (or replaced) at path."""
    if os.path.isdir(path):
        raise OutputPathError(f"{path}: cannot create: it is a directory")
    parent = os.path.dirname(os.path.realpath(path)) or "."
    if not os.path.isdir(parent):
        raise OutputPathError(f"{path}: cannot create: no directory {os.path.dirname(path)}")
    if os.path.exists(path):
        if not os.access(path, os.W_OK):
            raise OutputPathError(f"{path}: cannot create: permission denied")
    elif not os.access(parent, os.W_OK):
        raise OutputPathError(f"{path}: cannot create: permission denied")


def check_output_paths(inputs, outputs):
    """inputs and outputs are (name, path) pairs, a name being the flag that
    gave the path ("--output") or the input's role ("the snapshot"); a path of
    None, "" or "-" is none. Raises OutputPathError naming both when an output
    is an input or another output, or cannot be written."""
    for i, (name, path) in enumerate(outputs):
        if not _named(path):
            continue
        for in_name, in_path in inputs:
            if _named(in_path) and same_file(path, in_path):
                raise OutputPathError(
                    f"{name} {path} is {in_name}: refusing to overwrite an input")
        for other_name, other_path in outputs[:i]:
            if _named(other_path) and same_file(path, other_path):
                raise OutputPathError(
                    f"{other_name} and {name} name the same file ({path}): each output needs "
                    "its own")
        try:
            check_writable(path)
        except OutputPathError as e:
            raise OutputPathError(f"{name} {e}") from None
