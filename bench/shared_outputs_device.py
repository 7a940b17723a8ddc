"""On a GPU: the shared output buffers page-locked for the driver (`cudaHostRegister`), a beat's
device-to-host copy into them checked bit for bit and timed against torch's own pinned memory
and against plain pageable memory.

    python bench/shared_outputs_device.py [--sessions 300] [--out F]
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch

from wave_actors.shared_outputs import SharedOutputs


def _copy_ms(dst: torch.Tensor, src: torch.Tensor, reps: int = 50) -> float:
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    return round(1e3 * float(np.median(times)), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=300)
    ap.add_argument("--out")
    args = ap.parse_args()
    shared = SharedOutputs(args.sessions)
    pcm = shared.outputs[0].pcm
    err = int(torch.cuda.cudart().cudaHostRegister(pcm.ctypes.data, pcm.nbytes, 0))
    host = torch.from_numpy(pcm)
    src = torch.randn(pcm.shape, device="cuda")
    host.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    equal = bool(torch.equal(host, src.cpu()))
    pinned = torch.empty(pcm.shape, pin_memory=True)
    pageable = torch.empty(pcm.shape)
    result = {"sessions": args.sessions, "bytes": pcm.nbytes, "register_error": err,
              "is_pinned": bool(host.is_pinned()), "bit_equal": equal,
              "d2h_ms": {"shared_registered": _copy_ms(host, src),
                         "torch_pinned": _copy_ms(pinned, src),
                         "pageable": _copy_ms(pageable, src)}}
    if err == 0:
        torch.cuda.cudart().cudaHostUnregister(pcm.ctypes.data)
    del host
    shared.close()
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"command": "python bench/shared_outputs_device.py --sessions "
                       f"{args.sessions}", "gpu": torch.cuda.get_device_name(),
                       "result": result}, f, indent=1)


if __name__ == "__main__":
    main()
