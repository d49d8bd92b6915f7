"""What bf16 buys on this machine: PatchTST's matrix products in fp32 and bf16, side by side.

    python lab/bench_matmul.py               # PatchTST's ETTh1 script shapes, batch 32
    python lab/bench_matmul.py --tokens 4096 --d_model 1024 --d_ff 4096

`--use_amp` can only pay off where the bf16 products are faster than the fp32 ones. For each
linear layer of one PatchTST encoder layer (tokens = batch x channels x patches) this times the
forward product and both backward products (gradient of the input, gradient of the weight) in
fp32 and in bf16, interleaved, and prints the median times and the ratio. On CUDA the bf16 column
should be several times faster; on a CPU it depends on the instruction set (AMX tiles, or
AVX512-BF16 with a fast oneDNN path).
"""
import argparse
import platform
import statistics
import time

import torch


def timed(fn, device, repeats):
    """Median seconds of fn() over `repeats` calls, after two warm-up calls."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(2):
        fn()
    sync()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        sync()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds)


def products(tokens, d_in, d_out, dtype, device):
    """The three matrix products of one nn.Linear(d_in, d_out) training step."""
    x = torch.randn(tokens, d_in, dtype=dtype, device=device)
    w = torch.randn(d_out, d_in, dtype=dtype, device=device)
    grad = torch.randn(tokens, d_out, dtype=dtype, device=device)
    return {"forward x W^T": lambda: x @ w.t(), "grad input g W": lambda: grad @ w,
            "grad weight g^T x": lambda: grad.t() @ x}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=32 * 7 * 12, help="batch 32 x 7 channels x 12 patches")
    parser.add_argument("--d_model", type=int, default=512)
    parser.add_argument("--d_ff", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    opts = parser.parse_args()
    device = torch.device(opts.device)
    layers = {"attention projection": (opts.d_model, opts.d_model), "feed-forward in": (opts.d_model, opts.d_ff),
              "feed-forward out": (opts.d_ff, opts.d_model)}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    print(f"# Matrix products of one PatchTST layer, fp32 vs bf16: {name}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, {opts.tokens} tokens\n")
    print("| layer | product | fp32 ms | bf16 ms | fp32 / bf16 |\n|---|---|---|---|---|")
    total = {torch.float32: 0.0, torch.bfloat16: 0.0}
    for layer, (d_in, d_out) in layers.items():
        cases = {dtype: products(opts.tokens, d_in, d_out, dtype, device) for dtype in total}
        for product in cases[torch.float32]:
            ms = {dtype: 1e3 * timed(cases[dtype][product], device, opts.repeats) for dtype in total}
            for dtype in total:
                total[dtype] += ms[dtype]
            print(f"| {layer} {d_in}->{d_out} | {product} | {ms[torch.float32]:.2f} | {ms[torch.bfloat16]:.2f} | "
                  f"{ms[torch.float32] / ms[torch.bfloat16]:.2f}x |")
    print(f"| all | | {total[torch.float32]:.2f} | {total[torch.bfloat16]:.2f} | "
          f"{total[torch.float32] / total[torch.bfloat16]:.2f}x |")


if __name__ == "__main__":
    main()
