"""remat: a GPU memory runtime that keeps, drops (to recompute) or offloads
tensors under a memory budget.

`remat.torch` trains a PyTorch step under a budget (`remat.torch.budget`) and
records steps as op traces for `remat sim` (`remat.torch.record`); it needs
torch, which `import remat` alone does not.
"""
from remat._capi import RematError, find_library

__version__ = "0.9.0"
__all__ = ["RematError", "find_library", "library_version", "parse_size"]

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000**2,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1000**3, "gib": 1 << 30, "t": 1 << 40,
          "tb": 1000**4, "tib": 1 << 40}


def parse_size(size):
    """Bytes from an int or a string such as "2GiB", "512 MiB", "1.5GB" or
    "4096"; raises ValueError for anything else (negative, NaN, unknown
    units, not a whole number of bytes)."""
    if isinstance(size, bool):
        raise ValueError(f"not a size: {size!r}")
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"a size cannot be negative: {size}")
        return size
    if not isinstance(size, str):
        raise ValueError(f"a size is an int of bytes or a string like '2GiB', not {size!r}")
    text = size.strip()
    number = text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ").strip()
    unit = text[len(text.rstrip("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")):]
    factor = _UNITS.get(unit.lower())
    if factor is None or not number:
        raise ValueError(f"not a size: {size!r} (use bytes, or a unit: KiB, MiB, GiB, KB, MB, GB)")
    try:
        value = float(number)
    except ValueError:
        raise ValueError(f"not a size: {size!r}") from None
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"not a size: {size!r}")
    total = value * factor
    if total != int(total):
        raise ValueError(f"not a whole number of bytes: {size!r}")
    return int(total)


def library_version():
    """The version of the libremat.so this package loads."""
    from remat._capi import lib
    return lib().remat_version().decode()
