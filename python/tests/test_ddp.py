"""remat.torch.budget under DistributedDataParallel: two ranks (gloo, CPU),
each with its own budget; every rank's gradients equal plain DDP's."""
import datetime
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")
dist = pytest.importorskip("torch.distributed", reason="torch without distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this torch has no gloo backend", allow_module_level=True)

from _ranks import run_two_ranks  # noqa: E402


def _rank(rank, world, init_file, out_dir, python_path):
    sys.path[:0] = python_path
    import remat.torch
    from remat.torch.testing import models
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        results = {}
        for mode in ("plain", "remat"):
            model, _ = models.resnet(0)  # the same weights on every rank
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            torch.manual_seed(100 + rank)  # each rank its own batch
            x = torch.randn(8, 3, 16, 16)
            labels = torch.randint(0, 10, (8,))

            def step():
                return torch.nn.functional.cross_entropy(ddp(x), labels)
            if mode == "plain":
                step().backward()
            else:
                with remat.torch.budget(400_000, policy="dtr") as run:
                    step().backward()
                results["stats"] = run.stats
            results[mode] = [p.grad.clone() for p in model.parameters()]
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        # Both ranks done before either tears its group down: a peer that
        # closes its sockets while the other's gloo threads still talk to
        # it can abort that process ("terminate called without an active
        # exception", seen once under load).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_two_ranks_gradients_equal_plain_ddp(tmp_path):
    for r in run_two_ranks(_rank, tmp_path):
        assert r["stats"]["drops"] > 0, r["stats"]
        assert r["stats"]["peak_saved_bytes"] <= 400_000
        for a, b in zip(r["plain"], r["remat"]):
            assert torch.equal(a, b)
