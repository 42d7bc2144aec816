"""
bench_matmul_torch.py: PyTorch's CPU matmul (MKL or OpenBLAS, whichever torch was built with) at
the shapes and products dev/bench_matmul times, so that the two can be set side by side in one run
(dev/bench_cpu.sh does).

    python3 dev/bench_matmul_torch.py [runs] [N] [C]

The same arguments as dev/bench_matmul (runs 7, N = B*T = 256, C = 768 by default) and the same
products of a Linear layer, in fp32 on $OMP_NUM_THREADS threads (all cores when unset):
forward out = b + inp w^T, dinp = dout w, dweight = dout^T inp, each into a preallocated output, as
the trainer writes them. Prints a line naming torch's version and settings, then one line per
product, "shape product best median" in GFLOP/s, the best and the median of `runs` timed calls after
one that warms the caches.
"""
import os
import statistics
import sys
import time

import torch


def main():
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    N = int(sys.argv[2]) if len(sys.argv) > 2 else 256
    C = int(sys.argv[3]) if len(sys.argv) > 3 else 768
    if runs < 1 or N < 1 or C < 1:
        sys.exit(f"usage: {sys.argv[0]} [runs >= 1] [N] [C]")
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(42)
    shapes = [("qkv", C, 3 * C), ("attproj", C, C), ("fc", C, 4 * C), ("fcproj", 4 * C, C), ("logits", C, 50304)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, N={N}, C={C}, best of {runs} runs")
    for name, IC, OC in shapes:
        inp = torch.rand(N, IC, generator=gen) * 2 - 1
        w = torch.rand(OC, IC, generator=gen) * 2 - 1
        dout = torch.rand(N, OC, generator=gen) * 2 - 1
        b = torch.rand(OC, generator=gen) * 2 - 1
        out, dinp, dw = torch.empty(N, OC), torch.empty(N, IC), torch.empty(OC, IC)
        products = [("forward", lambda: torch.addmm(b, inp, w.t(), out=out)),
                    ("dinp", lambda: torch.matmul(dout, w, out=dinp)),
                    ("dweight", lambda: torch.matmul(dout.t(), inp, out=dw))]
        flops = 2.0 * N * IC * OC
        for product, call in products:
            call()
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                call()
                times.append(time.perf_counter() - start)
            print(f"{name} {product} {flops / min(times) * 1e-9:.1f} {flops / statistics.median(times) * 1e-9:.1f}")


if __name__ == "__main__":
    main()
