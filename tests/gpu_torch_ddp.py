"""tests/gpu_torch_ddp.py PKGDIR NAME OUTDIR: data-parallel training of the
emitted PyTorch module NAME.py with torch DistributedDataParallel over NCCL,
two processes on two GPUs; run by tests/gpu_torch_ddp.test. Each rank
builds the same Model (seed 1), wraps it in DDP, and takes STEPS steps of
torch.optim.AdamW on its own shard of a fixed batch (MSE against zeros);
rank r saves its final weights to OUTDIR/weights-r.pt. The test compares
the ranks (DDP keeps replicas identical) and two runs (determinism: the
all-reduce of two ranks adds two numbers, which is exact in either order)."""
import importlib
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

STEPS = 3


def rank_main(rank, world, pkg, name, outdir, port):
    sys.path.insert(0, pkg)
    M = importlib.import_module(name)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    try:
        model = M.Model(None, device=torch.device("cuda", rank), seed=1)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
        g = torch.Generator().manual_seed(1234)   # the same global batch on every rank
        B, T = 2 * world, min(16, M.MAX_SEQ_LEN)
        for _ in range(STEPS):
            u = torch.randn(B, T, M.IN_DIM, generator=g)[rank * 2:(rank + 1) * 2].cuda(rank)
            out, _state = ddp(u)
            loss = out.pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        torch.cuda.synchronize()
        torch.save(model.weights.detach().cpu(), os.path.join(outdir, "weights-%d.pt" % rank))
    finally:
        dist.destroy_process_group()


def main():
    pkg, name, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
    port = int(os.environ.get("MG_DDP_PORT", "29517"))
    os.makedirs(outdir, exist_ok=True)
    mp.spawn(rank_main, args=(2, pkg, name, outdir, port), nprocs=2, join=True)


if __name__ == "__main__":
    main()
