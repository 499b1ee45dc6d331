"""cuBLAS fp32 (TF32 off) on the probe's GEMM sizes, C = B @ A as gen.py lays them out."""
import torch, time
torch.backends.cuda.matmul.allow_tf32 = False
for name, (M, N, K) in {"sq4096": (4096, 4096, 4096), "1x1_256to64": (100352, 64, 256), "1x1_64to256": (100352, 256, 64), "s2": (25088, 128, 1152)}.items():
    a = torch.randn(K, M, device="cuda"); b = torch.randn(N, K, device="cuda")
    for _ in range(3): c = b @ a
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(20):
        s.record(); c = b @ a; e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); ms = ts[10]
    print(f"cublas fp32 {name:14} {ms:.4f} ms {2*M*N*K/ms/1e9:.1f} TFLOP/s")
