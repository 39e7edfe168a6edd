"""Ctrl-C while a budget is open.

Python raises KeyboardInterrupt wherever the main thread happens to be when
it handles SIGINT. In a few places of remat that would do harm: the budget's
entry and exit (the runtime, the dispatch modes, the saved-tensor hooks and
the collector's pause half set up or half let go), its close(), and the
functions the C library calls back (an exception cannot cross the C library:
ctypes prints it and the library reads a return value never set).

While a budget is open on the main thread (and while close() runs), remat's
handler stands in front of the one before it: an interrupt that lands where
one of the functions marked `critical` is running (or anything it calls) is
held, and raised, by the handler before remat's, at the next delivery point
(`deliver()`): the end of the budget's entry and exit, the start of a replay
the library calls back for, the return of a call into the library that may
call back. An interrupt anywhere else is raised at once, as without remat.
"""
import _signal  # (signal's own functions: the module's wrappers convert enums, 15x slower)
import sys
import threading

_critical = set()   # code objects whose frames hold an interrupt
_MAIN = threading.main_thread().ident


class _State:
    depth = 0           # install() calls not yet undone (main thread only)
    installed = False   # remat's handler is SIGINT's
    previous = None     # the handler before it
    pending = None      # a signal held, to raise at the next delivery point
    delivered = 0       # interrupts raised through remat's handler so far


def critical(fn):
    """Marks fn: an interrupt that lands while it runs (or anything it
    calls) waits for the next delivery point."""
    # (A contextmanager: its generator's code, not the wrapper's, which
    # every contextmanager shares.)
    _critical.add(getattr(fn, "__wrapped__", fn).__code__)
    return fn


def _in_critical(frame):
    while frame is not None:
        if frame.f_code in _critical:
            return True
        frame = frame.f_back
    return False


def _handler(signum, frame):
    if _in_critical(frame):
        _State.pending = signum
        return
    _State.pending = None
    _raise(signum, frame)


def _raise(signum, frame):
    _State.delivered += 1
    previous = _State.previous
    if callable(previous):
        previous(signum, frame)


def install():
    """remat's handler in front of SIGINT's (main thread only; where SIGINT
    has no Python handler, none). Returns a token for uninstall(). Called
    from critical code: an interrupt as it installs waits."""
    if threading.get_ident() != _MAIN:
        return False
    if _State.depth == 0:
        _State.pending = None
        current = _signal.getsignal(_signal.SIGINT)
        if current is _handler or not callable(current):
            # Ignored, the default action, or a handler set outside Python
            # (None, which no handler can be set back to): nothing to stand
            # in front of, and SIGINT's handler is left alone.
            return False
        try:
            previous = _signal.signal(_signal.SIGINT, _handler)
        except ValueError:  # not the main interpreter
            return False
        _State.previous = previous
        _State.installed = True
    _State.depth += 1
    return True


def uninstall(token):
    """Undoes install(): the handler before remat's is SIGINT's again (where
    nothing replaced remat's since), then an interrupt held is raised."""
    if not token:
        return
    _State.depth -= 1
    if _State.depth == 0 and _State.installed:
        _State.installed = False
        current = _signal.signal(_signal.SIGINT, _State.previous)
        if current is not _handler:
            _signal.signal(_signal.SIGINT, current)  # replaced inside: left as it was
        deliver()


def pending():
    """Whether an interrupt is held (for the main thread: signals reach no
    other)."""
    return _State.pending is not None and threading.get_ident() == _MAIN


def deliver():
    """A delivery point: an interrupt held is raised here (by the handler
    before remat's: KeyboardInterrupt for Python's own). On another thread
    than the main one, nothing: the interrupt is the main thread's."""
    signum = _State.pending
    if signum is not None and threading.get_ident() == _MAIN:
        _State.pending = None
        _raise(signum, sys._getframe(1))


def delivered():
    """How many interrupts remat's handler has raised so far (a step compares
    the count at its start and end: was it interrupted?)."""
    return _State.delivered
