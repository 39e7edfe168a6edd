"""The remat package without torch: sizes, the library found and loaded,
and the runtime's events through the C ABI (run with python3 -m unittest)."""
import ctypes
import importlib.util
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import remat  # noqa: E402
from remat import _capi  # noqa: E402

MIB = 1 << 20


class PackageTest(unittest.TestCase):
    def test_sizes(self):
        self.assertEqual(remat.parse_size("2GiB"), 2 << 30)
        self.assertEqual(remat.parse_size(" 512 MiB "), 512 << 20)
        self.assertEqual(remat.parse_size("1.5KiB"), 1536)
        self.assertEqual(remat.parse_size("3GB"), 3 * 10**9)
        self.assertEqual(remat.parse_size(0), 0)
        for bad in ["", "GiB", "-1MiB", "nan", "infGiB", "1.3B", "3 parsecs", -5, True, 1.5,
                    None]:
            with self.assertRaises(ValueError, msg=repr(bad)):
                remat.parse_size(bad)

    def test_library_loads(self):
        self.assertRegex(remat.library_version(), r"^\d+\.\d+\.\d+$")

    def test_missing_library_is_a_clear_error(self):
        old = os.environ.get("REMAT_LIBRARY")
        os.environ["REMAT_LIBRARY"] = "/nonexistent/libremat.so"
        try:
            with self.assertRaisesRegex(ImportError, "REMAT_LIBRARY"):
                _capi.find_library()
        finally:
            if old is None:
                del os.environ["REMAT_LIBRARY"]
            else:
                os.environ["REMAT_LIBRARY"] = old

    def test_a_relative_library_path_is_made_absolute(self):
        # The native recorder links against it from its own build folder.
        found = _capi.find_library()
        old = os.environ.get("REMAT_LIBRARY")
        os.environ["REMAT_LIBRARY"] = os.path.relpath(found)
        try:
            self.assertEqual(_capi.find_library(), os.path.realpath(found))
            self.assertTrue(os.path.isabs(_capi.find_library()))
        finally:
            if old is None:
                del os.environ["REMAT_LIBRARY"]
            else:
                os.environ["REMAT_LIBRARY"] = old

    def test_a_library_of_another_abi_is_refused(self):
        self.assertEqual(_capi.lib().remat_abi_version(), _capi.ABI_VERSION)

        class OldLibrary:
            def remat_abi_version(self):
                return _capi.ABI_VERSION - 1

        saved_lib, saved_cdll = _capi._lib, _capi.ctypes.CDLL
        _capi._lib = None
        _capi.ctypes.CDLL = lambda path: OldLibrary()
        try:
            with self.assertRaisesRegex(ImportError, "C ABI version"):
                _capi.lib()
        finally:
            _capi._lib, _capi.ctypes.CDLL = saved_lib, saved_cdll

    @unittest.skipIf(importlib.util.find_spec("torch") is not None, "torch is installed here")
    def test_remat_torch_without_torch_says_what_to_install(self):
        with self.assertRaisesRegex(ImportError, "pip install"):
            import remat.torch  # noqa: F401


class EventsTest(unittest.TestCase):
    """A framework that keeps its tensors itself follows the runtime's
    choices through remat_runtime_create_observed's events."""

    def test_drop_and_recompute_are_told(self):
        lib = _capi.lib()
        ao = _capi.AllocatorOptions()
        _capi.check(lib.remat_allocator_options_init(ctypes.byref(ao)), "options")
        allocator = ctypes.c_void_p()
        _capi.check(lib.remat_allocator_create(ctypes.byref(ao), ctypes.byref(allocator)),
                    "allocator")
        ro = _capi.RuntimeOptions()
        _capi.check(lib.remat_runtime_options_init(ctypes.byref(ro)), "options")
        ro.policy = b"lru"
        ro.live_budget = 8 * MIB
        events = []

        def on_event(_user, e):
            events.append((e.contents.kind, e.contents.tensor, e.contents.pressure))
        on_event_c = _capi.EVENT_FN(on_event)
        runs = []

        def recompute(user, _inputs, _n, _out, nbytes, _stream):
            runs.append((user, nbytes))
            return 0
        recompute_c = _capi.RECOMPUTE_FN(recompute)
        runtime = ctypes.c_void_p()
        _capi.check(lib.remat_runtime_create_observed(allocator, ctypes.byref(ro), on_event_c,
                                                      None, ctypes.byref(runtime)), "runtime")
        try:
            opts = _capi.TensorOptions()
            opts.allow_drop = 1
            opts.recompute = recompute_c
            opts.user_data = 7
            opts.compute_ns = 1000
            ids = []
            for _ in range(3):  # the third pushes the first out
                tid = ctypes.c_uint64()
                _capi.check(lib.remat_tensor_create(runtime, 4 * MIB, ctypes.byref(opts), 0,
                                                    ctypes.byref(tid), None), "create")
                _capi.check(lib.remat_tensor_release(runtime, tid.value), "release")
                ids.append(tid.value)
            self.assertIn((_capi.EVENT_DROPPED, ids[0], 1), events)
            p = ctypes.c_void_p()
            _capi.check(lib.remat_tensor_acquire(runtime, ids[0], 0, ctypes.byref(p)), "acquire")
            self.assertEqual(runs, [(7, 4 * MIB)])
            self.assertIn((_capi.EVENT_RECOMPUTED, ids[0], 0), events)
            _capi.check(lib.remat_tensor_release(runtime, ids[0]), "release")
            with self.assertRaisesRegex(_capi.RematError, "does not exist"):
                _capi.check(lib.remat_tensor_release(runtime, 999999), "release")
        finally:
            lib.remat_runtime_destroy(runtime)
            lib.remat_allocator_destroy(allocator)


if __name__ == "__main__":
    unittest.main()
