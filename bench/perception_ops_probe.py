import torch, math
dev="cuda"; B,H,F,R,dh,D=112,8,2,72,128,1024
bf=torch.bfloat16
u=torch.randn(B,F,D,device=dev,dtype=bf)
lin=torch.nn.Linear(D,D,bias=False,device=dev,dtype=bf)
q=lin(u).unflatten(-1,(H,dh)).transpose(1,2)
ub=torch.randn(H,dh,device=dev,dtype=bf); p=torch.randn(R,H,dh,device=dev,dtype=bf)
k=torch.randn(B,H,R,dh,device=dev,dtype=bf); v=torch.randn(B,H,R,dh,device=dev,dtype=bf)
s=torch.randn(B,H,F,R,device=dev).softmax(-1)
sb=s.to(bf)
cands={
 "ac (q+u)@kT": lambda: (q+ub[:,None])@k.transpose(-1,-2),
 "bd einsum": lambda: torch.einsum("bhqd,khd->bhqk", q+ub[:,None], p),
 "p@v": lambda: sb@v,
 "p@v fp32 bcast": lambda: (s[...,None]*v[:,:,None].float()).sum(-2).to(bf),
 "p@v bf16 bcast": lambda: (sb[...,None]*v[:,:,None]).sum(-2),
 "vT@pT": lambda: (v.transpose(-1,-2)@sb.transpose(-1,-2)).transpose(-1,-2),
 "p@v einsum": lambda: torch.einsum("bhfr,bhrd->bhfd", sb, v),
 "p@v per f": lambda: torch.cat([sb[:,:,f:f+1]@v for f in range(F)],2),
}
for name,f in cands.items():
    for _ in range(3): f()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as pr:
        for _ in range(10): f()
        torch.cuda.synchronize()
    evs=sorted(pr.key_averages(), key=lambda e:-e.device_time_total)
    tot=sum(e.device_time_total for e in evs)/10
    print(f"{name:16s} {tot:8.1f} us  "+" | ".join(f"{e.key[:60]} {e.device_time_total/10:.1f}" for e in evs[:2]))
ref=(sb@v).float()
for name in ("p@v fp32 bcast","p@v bf16 bcast","vT@pT","p@v per f"):
    print(name, ((cands[name]().float()-ref).norm()/ref.norm()).item())
