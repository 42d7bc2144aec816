"""
train_gpt2.py: the PyTorch reference that llm3d's C and CUDA trainers are tested against.

It builds the same GPT-2 (fp32, tied lm_head, tanh GELU, no dropout), initialises it from a
descriptor and a seed or loads an llm.c model file (--random-ln then sets its LayerNorm weights and
biases to seeded noise instead of 1 and 0), and writes:
  --write-model FILE   an llm.c model file (version 3 = fp32, 5 = bf16 with --dtype bf16)
  --write-state FILE   an llm.c debug-state file: one batch, its logits, loss and every gradient,
                       then the losses and grad norms of --steps AdamW steps on that same batch
  --bench              times training steps (random tokens) and prints ms/step and tokens/s
  --self-test          round-trips the files and checks that they reproduce (see self_test)

Parameters live in a dict of tensors laid out exactly as in the model file: each tensor holds
all layers, layer-major (qkvw is L x 3C x C). wte holds only the V real rows in memory; the
padded rows V..Vp-1 exist only on disk, as zeros.

The fixture in dev/fixtures was made with the commands in dev/fixtures/README.md.
"""
import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

MODEL_MAGIC = 20240326
STATE_MAGIC = 20240327
STATE_VERSION = 2
HEADER_INTS = 256
# llm.c's shapes for the GPT-2 sizes; any other dN is L = N, C = 64N, NH = N
GPT2_SHAPES = {12: (768, 12), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25)}
PARAM_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
               "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
DECAYED = ["wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"]  # the 2-D matrices
HYPER_NAMES = ["lr", "beta1", "beta2", "eps", "weight_decay", "grad_clip"]  # state slots 8..13


class FileError(Exception):
    """A file that cannot be read as what it claims to be; the message names file and field."""


class Config:
    def __init__(self, L, NH, C, V, maxT):
        self.L, self.NH, self.C, self.V, self.maxT = L, NH, C, V, maxT
        self.Vp = (V + 127) // 128 * 128  # llm.c pads the vocabulary for aligned kernels

    def __repr__(self):
        return f"L={self.L} NH={self.NH} C={self.C} V={self.V} Vp={self.Vp} maxT={self.maxT}"


def param_shapes(cfg, wte_rows):
    L, C = cfg.L, cfg.C
    return {"wte": (wte_rows, C), "wpe": (cfg.maxT, C),
            "ln1w": (L, C), "ln1b": (L, C), "qkvw": (L, 3 * C, C), "qkvb": (L, 3 * C),
            "attprojw": (L, C, C), "attprojb": (L, C), "ln2w": (L, C), "ln2b": (L, C),
            "fcw": (L, 4 * C, C), "fcb": (L, 4 * C), "fcprojw": (L, C, 4 * C), "fcprojb": (L, C),
            "lnfw": (C,), "lnfb": (C,)}


def init_params(cfg, seed):
    gen = torch.Generator().manual_seed(seed)
    residual_std = 0.02 / math.sqrt(2 * cfg.L)  # keeps the residual stream's variance flat in depth
    params = {}
    for name, shape in param_shapes(cfg, cfg.V).items():
        t = torch.zeros(shape)
        if name in ("ln1w", "ln2w", "lnfw"):
            t.fill_(1.0)
        elif name in DECAYED:
            std = residual_std if name in ("attprojw", "fcprojw") else 0.02
            t.normal_(0.0, std, generator=gen)
        params[name] = t
    return params


def randomize_layernorms(params, seed):
    """LayerNorm weights 1 + 0.2 N(0,1) and biases 0.1 N(0,1), in place, from their own generator.

    At init every LayerNorm weight is 1 and bias 0, so a backward that uses dout where it should
    use weight * dout (or forgets the bias) gives the same gradients as a correct one: a fixture
    made with these values tells them apart."""
    gen = torch.Generator().manual_seed(seed)
    for name in ("ln1w", "ln1b", "ln2w", "ln2b", "lnfw", "lnfb"):
        t = params[name]
        noise = torch.randn(t.shape, generator=gen)
        t.copy_(1.0 + 0.2 * noise if name.endswith("w") else 0.1 * noise)


# ----------------------------------------------------------------------------------------------
# llm.c model file

def bf16_bits(t):
    """fp32 tensor -> uint16 bf16 bit patterns, round to nearest, ties to even."""
    u = t.contiguous().numpy().view(np.uint32).astype(np.uint64)
    rounding = ((u >> 16) & 1) + 0x7FFF
    return ((u + rounding) >> 16).astype(np.uint16)


def bf16_to_fp32(bits):
    return torch.from_numpy((bits.astype(np.uint32) << 16).view(np.float32).copy())


def round_to_bf16(params):
    return {n: bf16_to_fp32(bf16_bits(t)).view(t.shape) for n, t in params.items()}


def padded_wte(cfg, wte):
    return torch.cat([wte, torch.zeros(cfg.Vp - cfg.V, cfg.C, dtype=wte.dtype)])


def write_model(path, cfg, params, dtype):
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [MODEL_MAGIC, 3 if dtype == "fp32" else 5, cfg.maxT, cfg.V, cfg.L, cfg.NH,
                  cfg.C, cfg.Vp]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        for name in PARAM_NAMES:
            t = params[name].detach().cpu().float()
            if name == "wte":
                t = padded_wte(cfg, t)
            if dtype == "fp32":
                f.write(t.contiguous().numpy().astype("<f4").tobytes())
            else:
                f.write(bf16_bits(t).astype("<u2").tobytes())


def read_header(path, data, magic):
    if len(data) < 4 * HEADER_INTS:
        raise FileError(f"{path}: header: file is {len(data)} bytes, shorter than the "
                        f"{4 * HEADER_INTS}-byte header")
    header = np.frombuffer(data[:4 * HEADER_INTS], dtype="<i4")
    if header[0] != magic:
        raise FileError(f"{path}: header[0] magic: {header[0]}, expected {magic}")
    return header


def read_model(path):
    with open(path, "rb") as f:
        data = f.read()
    header = read_header(path, data, MODEL_MAGIC)
    version = int(header[1])
    if version not in (3, 5):
        raise FileError(f"{path}: header[1] version: {version}, expected 3 (fp32) or 5 (bf16)")
    fields = ["maxT", "V", "L", "NH", "C", "Vp"]
    maxT, V, L, NH, C, Vp = (int(x) for x in header[2:8])
    for i, (name, value) in enumerate(zip(fields, (maxT, V, L, NH, C, Vp))):
        if value <= 0:
            raise FileError(f"{path}: header[{i + 2}] {name}: {value}, must be positive")
    if C % NH != 0:
        raise FileError(f"{path}: header[6] C: {C} is not a multiple of NH {NH}")
    cfg = Config(L, NH, C, V, maxT)
    if Vp != cfg.Vp:
        raise FileError(f"{path}: header[7] Vp: {Vp}, expected {cfg.Vp} (V={V} padded to 128)")
    shapes = param_shapes(cfg, Vp)
    itemsize = 4 if version == 3 else 2
    expected = 4 * HEADER_INTS + itemsize * sum(math.prod(s) for s in shapes.values())
    if len(data) != expected:
        raise FileError(f"{path}: size: {len(data)} bytes, expected {expected} for {cfg} "
                        f"version {version}")
    params, offset = {}, 4 * HEADER_INTS
    for name in PARAM_NAMES:
        count = math.prod(shapes[name])
        raw = data[offset:offset + count * itemsize]
        offset += count * itemsize
        if version == 3:
            t = torch.from_numpy(np.frombuffer(raw, dtype="<f4").astype(np.float32))
        else:
            t = bf16_to_fp32(np.frombuffer(raw, dtype="<u2"))
        t = t.view(shapes[name])
        params[name] = t[:V].clone() if name == "wte" else t
    return cfg, params, version


# ----------------------------------------------------------------------------------------------
# the model

def attention(q, k, v, use_sdpa):
    if use_sdpa:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T, hs = q.size(-2), q.size(-1)
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
    future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=q.device), diagonal=1)
    att = att.masked_fill(future, float("-inf"))
    return F.softmax(att, dim=-1) @ v


def forward(cfg, p, inputs, use_sdpa=False):
    """inputs (B, T) int64 -> logits (B, T, V) over the real tokens."""
    B, T = inputs.shape
    C, NH = cfg.C, cfg.NH
    hs = C // NH
    x = p["wte"][inputs] + p["wpe"][:T]
    for l in range(cfg.L):
        h = F.layer_norm(x, (C,), p["ln1w"][l], p["ln1b"][l], 1e-5)
        q, k, v = F.linear(h, p["qkvw"][l], p["qkvb"][l]).split(C, dim=2)
        q, k, v = (t.view(B, T, NH, hs).transpose(1, 2) for t in (q, k, v))
        y = attention(q, k, v, use_sdpa).transpose(1, 2).contiguous().view(B, T, C)
        x = x + F.linear(y, p["attprojw"][l], p["attprojb"][l])
        h = F.layer_norm(x, (C,), p["ln2w"][l], p["ln2b"][l], 1e-5)
        h = F.gelu(F.linear(h, p["fcw"][l], p["fcb"][l]), approximate="tanh")
        x = x + F.linear(h, p["fcprojw"][l], p["fcprojb"][l])
    x = F.layer_norm(x, (C,), p["lnfw"], p["lnfb"], 1e-5)
    return x @ p["wte"].T


def forward_backward(cfg, params, inputs, targets, fwd, autocast_dtype=None):
    for t in params.values():
        t.grad = None
    with torch.autocast(inputs.device.type, dtype=autocast_dtype or torch.bfloat16,
                        enabled=autocast_dtype is not None):
        logits = fwd(cfg, params, inputs)
    loss = F.cross_entropy(logits.float().view(-1, cfg.V), targets.reshape(-1))
    loss.backward()
    return logits, loss


def clip_grads(params, grad_clip):
    """Returns the global L2 norm before clipping; clips as torch.nn.utils.clip_grad_norm_."""
    grads = [t.grad for t in params.values()]
    # summed in float64 so the reference norm is exact to float32's last bit
    sq = torch.stack([torch.linalg.vector_norm(g, dtype=torch.float64) for g in grads])
    norm = torch.linalg.vector_norm(sq).float()
    if grad_clip > 0:
        # scaling by exactly 1.0 when under the limit leaves the grads bit-identical
        scale = torch.clamp(grad_clip / (norm + 1e-6), max=1.0)
        for g in grads:
            g.mul_(scale)
    return norm


def make_optimizer(params, args, fused):
    decayed = [params[n] for n in DECAYED]
    rest = [params[n] for n in PARAM_NAMES if n not in DECAYED]
    groups = [{"params": decayed, "weight_decay": args.weight_decay},
              {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps,
                             foreach=False, fused=fused)


def random_batch(V, B, T, seed, device="cpu"):
    """B x (T+1) random tokens shifted by one: targets[:, t] == inputs[:, t+1]."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (B, T + 1), generator=gen)
    return tokens[:, :-1].contiguous().to(device), tokens[:, 1:].contiguous().to(device)


# ----------------------------------------------------------------------------------------------
# debug state file

def compute_state(cfg, params, args):
    """One batch; its logits, loss and grads for the model as given; then args.steps AdamW steps."""
    params = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    inputs, targets = random_batch(cfg.V, args.B, args.T, args.data_seed)
    opt = make_optimizer(params, args, fused=False)
    state = {"inputs": inputs, "targets": targets, "losses": [], "norms": []}
    for step in range(args.steps):
        logits, loss = forward_backward(cfg, params, inputs, targets, forward)
        if step == 0:
            state["logits"] = logits.detach().clone()
            state["loss"] = loss.item()
            state["grads"] = {n: t.grad.clone() for n, t in params.items()}
        norm = clip_grads(params, args.grad_clip).item()
        opt.step()
        state["losses"].append(loss.item())
        state["norms"].append(norm)
        clipped = " (clipped)" if 0 < args.grad_clip < norm else ""
        print(f"step {step}: loss {loss.item():.6f} norm {norm:.6f}{clipped}")
    return state


def write_state(path, cfg, state, args):
    B, T = state["inputs"].shape
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:8] = [STATE_MAGIC, STATE_VERSION, B, T, len(state["losses"]), cfg.V, cfg.Vp, 0]
    hypers = np.array([getattr(args, n) for n in HYPER_NAMES], dtype="<f4")
    header[8:14] = hypers.view("<i4")
    f32 = lambda t: np.asarray(t, dtype="<f4").tobytes()
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(state["inputs"].numpy().astype("<i4").tobytes())
        f.write(state["targets"].numpy().astype("<i4").tobytes())
        f.write(f32(state["logits"].numpy()))
        f.write(f32([state["loss"]]))
        for name in PARAM_NAMES:
            g = state["grads"][name]
            f.write(f32((padded_wte(cfg, g) if name == "wte" else g).numpy()))
        f.write(f32(state["losses"]))
        f.write(f32(state["norms"]))


def read_state(path, cfg):
    with open(path, "rb") as f:
        data = f.read()
    header = read_header(path, data, STATE_MAGIC)
    if header[1] != STATE_VERSION:
        raise FileError(f"{path}: header[1] version: {header[1]}, expected {STATE_VERSION}")
    B, T, nsteps, V, Vp = (int(x) for x in header[2:7])
    if V != cfg.V or Vp != cfg.Vp:
        raise FileError(f"{path}: header[5..6] V, Vp: {V}, {Vp}, the model has {cfg.V}, {cfg.Vp}")
    shapes = param_shapes(cfg, cfg.Vp)
    counts = [B * T, B * T, B * T * V, 1] + [math.prod(shapes[n]) for n in PARAM_NAMES]
    counts += [nsteps, nsteps]
    expected = 4 * HEADER_INTS + 4 * sum(counts)
    if min(B, T, nsteps) < 0 or len(data) != expected:
        raise FileError(f"{path}: size: {len(data)} bytes, expected {expected} for B={B} T={T} "
                        f"steps={nsteps} and model {cfg}")
    values = np.frombuffer(data[4 * HEADER_INTS:], dtype="<i4")
    arrays, offset = [], 0
    for count in counts:
        arrays.append(values[offset:offset + count])
        offset += count
    as_f32 = lambda a: torch.from_numpy(a.view("<f4").astype(np.float32))
    state = {"inputs": torch.from_numpy(arrays[0].astype(np.int64)).view(B, T),
             "targets": torch.from_numpy(arrays[1].astype(np.int64)).view(B, T),
             "logits": as_f32(arrays[2]).view(B, T, V), "loss": float(as_f32(arrays[3])[0]),
             "grads": {n: as_f32(a).view(shapes[n]) for n, a in zip(PARAM_NAMES, arrays[4:-2])},
             "losses": as_f32(arrays[-2]).tolist(), "norms": as_f32(arrays[-1]).tolist(),
             "hypers": dict(zip(HYPER_NAMES, header[8:14].view("<f4").tolist()))}
    return state


# ----------------------------------------------------------------------------------------------
# bench

def bench(cfg, params, args):
    device = torch.device(args.device)
    params = {n: t.to(device).requires_grad_(True) for n, t in params.items()}
    inputs, targets = random_batch(cfg.V, args.B, args.T, args.data_seed, device)
    opt = make_optimizer(params, args, fused=True)
    fwd = lambda c, p, x: forward(c, p, x, use_sdpa=True)
    if args.compile:
        fwd = torch.compile(fwd)
    autocast_dtype = torch.bfloat16 if args.dtype_train == "bf16" else None
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    times = []
    for step in range(args.steps):
        sync()
        start = time.perf_counter()
        _, loss = forward_backward(cfg, params, inputs, targets, fwd, autocast_dtype)
        norm = clip_grads(params, args.grad_clip)
        opt.step()
        loss, norm = loss.item(), norm.item()  # .item() waits for the step to finish
        sync()
        ms = 1000 * (time.perf_counter() - start)
        times.append(ms)
        print(f"step {step + 1}/{args.steps}: loss {loss:.6f} norm {norm:.4f} ms {ms:.2f} "
              f"tokens/s {args.B * args.T / ms * 1000:.0f}", flush=True)
    median = statistics.median(times[args.bench_warmup:])
    print(f"bench: ms/step {median:.2f} tokens/s {args.B * args.T / median * 1000:.0f}")


# ----------------------------------------------------------------------------------------------
# self-test

def self_test(cfg, params, args):
    """Round-trips both file formats in a temp dir and checks that the state reproduces."""
    results = []

    def check(ok, what):
        results.append(bool(ok))
        print(f"self-test: {'ok' if ok else 'FAIL'}  {what}")

    with tempfile.TemporaryDirectory() as tmp:
        model_path = os.path.join(tmp, "model.bin")
        write_model(model_path, cfg, params, "fp32")
        cfg2, loaded, version = read_model(model_path)
        check(version == 3 and repr(cfg2) == repr(cfg), f"fp32 header: version {version}, {cfg2}")
        check(all(torch.equal(params[n], loaded[n]) for n in PARAM_NAMES),
              "fp32 write then read gives identical tensors")
        raw = np.fromfile(model_path, dtype="<f4", offset=4 * HEADER_INTS)
        check(not raw[cfg.V * cfg.C:cfg.Vp * cfg.C].any(), "wte rows V..Vp-1 are zeros on disk")

        bf16_path = os.path.join(tmp, "model_bf16.bin")
        write_model(bf16_path, cfg, params, "bf16")
        _, loaded16, version = read_model(bf16_path)
        check(version == 5 and all(
            torch.equal(loaded16[n], params[n].to(torch.bfloat16).float()) for n in PARAM_NAMES),
            "bf16 write then read equals torch's round-to-nearest-even")
        ties = torch.tensor([1 + 2 ** -8, 1 + 3 * 2 ** -8, -(1 + 2 ** -8), 1 + 2 ** -8 + 2 ** -20])
        check(bf16_to_fp32(bf16_bits(ties)).tolist() == [1.0, 1 + 2 ** -6, -1.0, 1 + 2 ** -7],
              "bf16 ties round to even, above-half rounds up")

        state_path = os.path.join(tmp, "state.bin")
        state = compute_state(cfg, params, args)
        write_state(state_path, cfg, state, args)
        _, fresh, _ = read_model(model_path)
        check_state(check, "fresh state", cfg, fresh, read_state(state_path, cfg), args, rerun=False)
        if args.read_state:
            committed = read_state(args.read_state, cfg)
            check_state(check, args.read_state, cfg, params, committed, args, rerun=True)

        x, _ = random_batch(cfg.V, 2, min(8, cfg.maxT), 0)
        diff = (forward(cfg, params, x) - forward(cfg, params, x, use_sdpa=True)).abs().max()
        check(diff < 1e-5, f"scaled_dot_product_attention matches plain attention ({diff:.2e})")

        with open(model_path, "r+b") as f:
            f.truncate(4 * HEADER_INTS + 100)
        try:
            read_model(model_path)
            check(False, "truncated model file is refused")
        except FileError as e:
            check("size" in str(e), f"truncated model file is refused: {e}")
    failed = results.count(False)
    print(f"self-test: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


def check_state(check, label, cfg, params, state, args, rerun):
    """Recomputes a state's loss, logits and grads from params; with rerun, its steps too."""
    p = {n: t.clone().requires_grad_(True) for n, t in params.items()}
    logits, loss = forward_backward(cfg, p, state["inputs"], state["targets"], forward)
    check(loss.item() == state["loss"] and state["losses"][0] == state["loss"],
          f"{label}: loss from a freshly loaded model {loss.item():.7f} equals the stored "
          f"{state['loss']:.7f} and losses[0]")
    check(torch.equal(logits.detach(), state["logits"]), f"{label}: logits identical")
    grads_equal = all(torch.equal(padded_wte(cfg, p[n].grad) if n == "wte" else p[n].grad,
                                  state["grads"][n]) for n in PARAM_NAMES)
    check(grads_equal, f"{label}: every gradient tensor identical")
    if rerun:
        for name in HYPER_NAMES:
            setattr(args, name, state["hypers"][name])
        args.B, args.T = state["inputs"].shape
        args.steps = len(state["losses"])
        again = compute_state(cfg, params, args)
        worst = max(abs(a - b) for a, b in zip(again["losses"] + again["norms"],
                                                state["losses"] + state["norms"]))
        check(worst == 0, f"{label}: {args.steps} steps reproduce losses and norms exactly ({worst})")
        clipped = sum(n > args.grad_clip for n in state["norms"])
        print(f"self-test: {label}: {clipped} of {args.steps} steps clipped at {args.grad_clip}")


# ----------------------------------------------------------------------------------------------
# command line

class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, exit 2, as the rest of llm3d
        print(f"train_gpt2.py: {message}", file=sys.stderr)
        sys.exit(2)


def parse_args(argv):
    ap = Parser(description="PyTorch reference GPT-2 for llm3d (see the module docstring)")
    ap.add_argument("--init", help="descriptor dN: L=N, C=64N, NH=N (d12/d24/d36/d48: GPT-2)")
    ap.add_argument("--load", help="an llm.c model file (version 3 or 5)")
    ap.add_argument("--n-embd", type=int, help="override C of --init")
    ap.add_argument("--n-head", type=int, help="override NH of --init")
    ap.add_argument("--vocab", type=int, default=50257, help="V for --init")
    ap.add_argument("--max-seq", type=int, default=1024, help="maxT for --init")
    ap.add_argument("--seed", type=int, default=1337, help="init seed")
    ap.add_argument("--random-ln", action="store_true",
                    help="after --init or --load, set the LayerNorm weights (ln1w, ln2w, lnfw) to "
                         "1 + 0.2 N(0,1) and biases to 0.1 N(0,1), drawn from a generator seeded "
                         "with --seed, instead of 1 and 0, so the fixture's gradients depend on them")
    ap.add_argument("--write-model", help="write the model to this file")
    ap.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="--write-model dtype")
    ap.add_argument("--write-state", help="write the debug state to this file")
    ap.add_argument("--read-state", help="--self-test: also check this committed state file")
    ap.add_argument("-B", type=int, default=4, help="batch size")
    ap.add_argument("-T", type=int, default=16, help="sequence length")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--beta1", type=float, default=0.9)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--grad-clip", type=float, default=1.0, help="0 = off")
    ap.add_argument("--data-seed", type=int, default=42, help="seed of the random batch")
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--bench-warmup", type=int, default=3, help="steps left out of the median")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                    help="--bench device; the state is always computed on the CPU in fp32")
    ap.add_argument("--compile", action="store_true", help="--bench: torch.compile the forward")
    ap.add_argument("--dtype-train", choices=["fp32", "bf16"], default="fp32",
                    help="--bench: autocast dtype")
    ap.add_argument("--self-test", action="store_true")
    args = ap.parse_args(argv)
    if (args.init is None) == (args.load is None):
        ap.error("give exactly one of --init dN or --load FILE")
    positive = {"--vocab": args.vocab, "--max-seq": args.max_seq, "-B": args.B, "-T": args.T,
                "--steps": args.steps, "--eps": args.eps, "--n-embd": args.n_embd or 1,
                "--n-head": args.n_head or 1}
    for flag, value in positive.items():
        if value <= 0:
            ap.error(f"{flag} {value}: must be positive")
    for flag, value in {"--lr": args.lr, "--weight-decay": args.weight_decay,
                        "--grad-clip": args.grad_clip, "--bench-warmup": args.bench_warmup}.items():
        if value < 0:
            ap.error(f"{flag} {value}: must be >= 0")
    for flag, value in {"--beta1": args.beta1, "--beta2": args.beta2}.items():
        if not 0 <= value < 1:
            ap.error(f"{flag} {value}: must be in [0, 1)")
    if args.read_state and not args.self_test:
        ap.error(f"--read-state {args.read_state}: only used with --self-test")
    for name in HYPER_NAMES:  # the state file stores them as float32: train with those values
        setattr(args, name, float(np.float32(getattr(args, name))))
    if args.bench and args.steps <= args.bench_warmup:
        ap.error(f"--steps {args.steps}: must exceed --bench-warmup {args.bench_warmup}")
    return args, ap


def config_from_args(args, ap):
    name = args.init
    if len(name) < 2 or name[0] != "d" or not name[1:].isdigit() or int(name[1:]) == 0:
        ap.error(f"--init {name}: expected a descriptor dN with N >= 1, such as d2 or d12")
    L = int(name[1:])
    C, NH = GPT2_SHAPES.get(L, (64 * L, L))
    C, NH = args.n_embd or C, args.n_head or NH
    if C % NH != 0:
        ap.error(f"--n-embd {C}: not a multiple of --n-head {NH}")
    return Config(L, NH, C, args.vocab, args.max_seq)


def main(argv):
    args, ap = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("train_gpt2.py: --device cuda: no CUDA device is available", file=sys.stderr)
        return 1
    try:
        if args.init:
            cfg = config_from_args(args, ap)
            params = init_params(cfg, args.seed)
        else:
            cfg, params, _ = read_model(args.load)
        if args.random_ln:
            randomize_layernorms(params, args.seed)
        if args.T > cfg.maxT:
            ap.error(f"-T {args.T}: larger than the model's maxT {cfg.maxT}")
        print(f"model: {cfg}, {sum(t.numel() for t in params.values())} parameters")
        if args.self_test:
            return self_test(cfg, params, args)
        if args.write_model:
            write_model(args.write_model, cfg, params, args.dtype)
            if args.dtype == "bf16":  # the state then describes the model as written
                params = round_to_bf16(params)
            print(f"wrote {args.write_model} ({args.dtype})")
        if args.write_state:
            state = compute_state(cfg, params, args)
            write_state(args.write_state, cfg, state, args)
            print(f"wrote {args.write_state}: B={args.B} T={args.T} loss {state['loss']:.6f}")
        if args.bench:
            bench(cfg, params, args)
    except (FileError, OSError) as e:
        print(f"train_gpt2.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
