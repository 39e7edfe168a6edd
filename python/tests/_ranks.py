"""Two spawned ranks for the distributed tests (gloo, CPU)."""
import sys

import torch
import torch.multiprocessing as mp


def run_two_ranks(rank_fn, tmp_path):
    """Runs rank_fn(rank, world, init_file, out_dir, python_path) in two
    spawned processes and returns what each saved as out_dir/rank<r>.pt."""
    python_path = [p for p in sys.path if p]
    mp.start_processes(rank_fn, args=(2, str(tmp_path / "init"), str(tmp_path), python_path),
                       nprocs=2, join=True, start_method="spawn")
    return [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
