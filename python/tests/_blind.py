"""The budget's drop-first estimate made blind, for the tests of replays that
cannot fit (shared by the CPU and CUDA tests)."""


def drop_first_drops_blindly(monkeypatch, backups=True, every_plan=False):
    """The drop-first plan drops wherever the runtime may, its estimate of
    what a replay needs made blind (a replay room of 1 PiB), so that some of
    its replays cannot fit (an estimate that falls short, as on models it
    has not seen). `backups`: False, no drop is copied first. `every_plan`:
    the mixed plans' estimate is made blind too."""
    from remat.torch import _budget, _native
    for engine in (_budget.Engine, _native.NativeEngine):  # (the Python and native steps)
        init = engine.__init__

        def blind(self, *args, _init=init, **kw):
            _init(self, *args, **kw)
            if self.drop_first or every_plan:
                self.replay_room = 1 << 50
            if not backups:
                self.backups = False
        monkeypatch.setattr(engine, "__init__", blind)
    if not backups:
        monkeypatch.setattr(_budget.Engine, "_wants_backup", lambda self, s: False)
