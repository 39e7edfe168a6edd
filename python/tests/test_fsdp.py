"""remat.torch.budget under FSDP (fully_shard): two ranks (gloo, CPU), each
layer and the model sharded, each rank with its own budget; every rank's
gradient shards equal plain FSDP's bit for bit."""
import datetime
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="remat.torch needs torch (pip install torch)")
dist = pytest.importorskip("torch.distributed", reason="torch without distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("this torch has no gloo backend", allow_module_level=True)
try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
except ImportError:
    pytest.skip("this torch has no fully_shard (FSDP2)", allow_module_level=True)

from _ranks import run_two_ranks  # noqa: E402

BUDGET = 60_000  # bytes of saved activations per rank: under the plain step's


def _rank(rank, world, init_file, out_dir, python_path):
    sys.path[:0] = python_path
    import remat.torch
    from remat.torch.testing import models
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        mesh = init_device_mesh("cpu", (world,))
        results = {}
        for mode in ("plain", "remat"):
            model, _ = models.mlp(0, width=64, depth=4, batch=16)  # the same weights everywhere
            for layer in model:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            torch.manual_seed(100 + rank)  # each rank its own batch
            x = torch.randn(16, 64)

            def step():
                return model(x).square().mean()
            if mode == "plain":
                step().backward()
            else:
                with remat.torch.budget(BUDGET, policy="dtr") as run:
                    step().backward()
                results["stats"] = run.stats
            results[mode] = [p.grad.to_local().clone() for p in model.parameters()]
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        # Both ranks done before either tears its group down: a peer that
        # closes its sockets while the other's gloo threads still talk to
        # it can abort that process ("terminate called without an active
        # exception", seen once under load).
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.python_recorder
def test_two_ranks_gradients_equal_plain_fsdp(tmp_path):
    for r in run_two_ranks(_rank, tmp_path):
        assert r["stats"]["drops"] > 0 and r["stats"]["recomputes"] > 0, r["stats"]
        assert r["stats"]["peak_saved_bytes"] <= BUDGET
        assert len(r["plain"]) == len(r["remat"]) > 0
        for a, b in zip(r["plain"], r["remat"]):
            assert torch.equal(a, b)
