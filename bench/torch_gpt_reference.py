# Reference measurement on a GPU machine with PyTorch (not built or run by CI,
# which has no GPU and no PyTorch): is a small GPT's training step bound by the
# host's kernel launches, and how long do its kernels take?
#
#   python3 bench/torch_gpt_reference.py            # both cases, JSON lines
#   TOP=30 python3 bench/torch_gpt_reference.py     # the 1.7B case with its 30 longest kernels
#   ATTENTION=1 python3 bench/torch_gpt_reference.py # fused attention alone, with and without dropout
#
# Eager PyTorch, bf16, fused SDPA attention (cuDNN flash on Hopper) with
# dropout 0.1, unfused element-wise ops: the wall time of one micro-batch's
# forward and backward against the summed time of its GPU kernels
# (torch.profiler). Cases: the 1.7B model of the Megatron-LM README H100 table
# (h 2048, 16 heads, 24 layers, seq 4096, vocab 131072, tp 1) and one GPU's
# share of the 7.1B row at tp 2 (h 4096, 16 of 32 heads, ffn 8192 of 16384,
# 30 layers, vocab 65536 of 131072). docs/validation.md cites its figures.
import json, os, sys, time
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import profile, ProfilerActivity

torch.backends.cuda.matmul.allow_tf32 = True
dev = "cuda"

class Block(nn.Module):
    def __init__(s, h, heads, ffn):
        super().__init__()
        s.ln1 = nn.LayerNorm(h); s.ln2 = nn.LayerNorm(h)
        s.qkv = nn.Linear(h, 3 * heads * 128); s.proj = nn.Linear(heads * 128, h)
        s.fc1 = nn.Linear(h, ffn); s.fc2 = nn.Linear(ffn, h)
        s.heads = heads; s.drop = nn.Dropout(0.1)
    def forward(s, x):
        b, t, _ = x.shape
        q, k, v = s.qkv(s.ln1(x)).view(b, t, 3, s.heads, 128).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=0.1)
        x = x + s.drop(s.proj(a.transpose(1, 2).reshape(b, t, -1)))
        return x + s.drop(s.fc2(F.gelu(s.fc1(s.ln2(x)))))

class GPT(nn.Module):
    def __init__(s, h, heads, ffn, layers, vocab, seq):
        super().__init__()
        s.emb = nn.Embedding(vocab, h); s.pos = nn.Embedding(seq, h)
        s.blocks = nn.ModuleList([Block(h, heads, ffn) for _ in range(layers)])
        s.ln = nn.LayerNorm(h); s.out = nn.Linear(h, vocab, bias=False)
    def forward(s, ids, tgt):
        x = s.emb(ids) + s.pos.weight[: ids.shape[1]]
        for blk in s.blocks: x = blk(x)
        return F.cross_entropy(s.out(s.ln(x)).float().view(-1, s.out.out_features), tgt.view(-1))

def flops(h, heads, ffn, layers, vocab, seq):
    # model FLOPs of fwd+bwd of one sequence (GEMMs x 3, attention without causal halving)
    per_tok = layers * (2 * h * 3 * heads * 128 + 2 * heads * 128 * h + 4 * h * ffn) + 2 * h * vocab
    attn = layers * 4 * seq * heads * 128
    return 3 * seq * (per_tok + attn)

def run(name, h, heads, ffn, layers, vocab=131072, seq=4096, iters=8):
    torch.manual_seed(0)
    m = GPT(h, heads, ffn, layers, vocab, seq).to(dev, torch.bfloat16)
    ids = torch.randint(0, vocab, (1, seq), device=dev); tgt = torch.randint(0, vocab, (1, seq), device=dev)
    def step():
        loss = m(ids, tgt); loss.backward()
    for _ in range(3): step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters): step()
    torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) / iters
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(2): step()
        torch.cuda.synchronize()
    kern = sum(e.self_device_time_total for e in prof.key_averages()) / 2 / 1e6
    if os.environ.get("TOP"):
        rows = sorted(((e.self_device_time_total / 2 / 1e3, e.count // 2, e.key) for e in prof.key_averages() if e.self_device_time_total > 0), reverse=True)
        for ms, c, k in rows[:int(os.environ["TOP"])]:
            print(f"  {ms:8.3f} ms {c:6d}x  {k[:110]}", flush=True)
    nk = sum(e.count for e in prof.key_averages() if e.self_device_time_total > 0) / 2
    f = flops(h, heads, ffn, layers, vocab, seq)
    r = dict(case=name, wall_s=wall, kernel_s=kern, kernels=nk, host_bound_fraction=max(0.0, 1 - kern / wall),
             tflops_wall=f / wall / 1e12, tflops_kernels=f / kern / 1e12, us_per_kernel=kern / nk * 1e6)
    print(json.dumps(r), flush=True)
    del m; torch.cuda.empty_cache()
    return r

def attention_alone():
    # SDPA (cuDNN flash on Hopper), batch 1, seq 4096, head dim 128, causal:
    # forward and backward TFLOP/s as FlashAttention counts them, dropout 0 and 0.1.
    def bench(f, iters=20):
        for _ in range(3): f()
        torch.cuda.synchronize()
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters): f()
        e.record(); torch.cuda.synchronize()
        return s.elapsed_time(e) / iters / 1e3
    for heads, seq in ((16, 4096), (32, 4096), (64, 4096)):
        q, k, v = (torch.randn(1, heads, seq, 128, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        fl = 4 * heads * seq * seq * 128 / 2
        for p in (0.0, 0.1):
            fwd = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p))
            g = torch.randn_like(F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p))
            def fb():
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
                torch.autograd.grad(out, (q, k, v), g)
            both = bench(fb)
            print(json.dumps(dict(heads=heads, seq=seq, dropout=p, fwd_ms=fwd * 1e3, bwd_ms=(both - fwd) * 1e3,
                                  fwd_tflops=fl / fwd / 1e12, bwd_tflops=2.5 * fl / (both - fwd) / 1e12)), flush=True)

print(torch.__version__, torch.cuda.get_device_name(), flush=True)
if os.environ.get("ATTENTION"):
    attention_alone()
    sys.exit(0)
out = [run("gpt-1.7b (h2048, 24 layers)", 2048, 16, 8192, 24)]
out += [] if os.environ.get("TOP") else [run("7.1b tp-2 shard (h4096, 16 heads, ffn 8192, vocab 65536, 30 layers)", 4096, 16, 8192, 30, vocab=65536)]
json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "hostbound.json"), "w"), indent=1)
