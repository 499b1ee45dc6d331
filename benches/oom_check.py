"""Fills GPU memory with 2 GB tensors until the device runs out, then checks that the
failure is a convtune.OutOfMemoryError (not a crash) and that conv2d works again once the
tensors are freed. For GPU machines: on a CPU driver it would fill host memory."""

import gc
import sys
import time

import numpy as np

import convtune


def main() -> int:
    info = convtune.adapter_info()
    if info["type"] == "Cpu":
        print("skipped: CPU adapter")
        return 0
    x = np.ones((1, 1, 16384, 32767), np.float32)  # just under the 2 GiB binding limit
    held, err = [], None
    t0 = time.perf_counter()
    for _ in range(100):  # 200 GB: more than any card this runs on
        try:
            held.append(convtune.to_device(x))
        except Exception as e:  # noqa: BLE001 - the type is what is checked
            err = e
            break
    print(f"held {len(held)} tensors ({len(held) * x.nbytes / 2**30:.0f} GiB) in {time.perf_counter() - t0:.0f} s")
    print(f"then: {type(err).__name__}: {err}")
    ok_type = isinstance(err, convtune.OutOfMemoryError)
    del held
    gc.collect()
    w = np.ones((4, 1, 3, 3), np.float32)
    y = convtune.conv2d(np.ones((1, 1, 8, 8), np.float32), w, padding=1)
    again = convtune.to_device(x).numpy()[0, 0, 0, :4]
    print(f"after freeing: conv2d ok={bool(np.isfinite(y).all() and y[0, 0, 4, 4] == 9)}, "
          f"2 GB upload ok={bool((again == 1).all())}, memory {convtune.memory_stats()}")
    return 0 if ok_type else 1


if __name__ == "__main__":
    sys.exit(main())
