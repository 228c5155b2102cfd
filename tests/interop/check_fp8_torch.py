"""check_fp8_torch.py: megatrain's fp8 conversions (core/base/dtype.h, through Tensor) against PyTorch's
torch.float8_e4m3fn and torch.float8_e5m2, an implementation written apart from ours.

Reads the file test_fp8's Fp8Dump test writes (MEGATRAIN_FP8_DUMP=FILE): every code's float value per format, and
the codes of a sweep of float32 inputs (every value, every midpoint and the floats beside it, beyond the range,
specials, random values and random bit patterns). Checks:
  * every code decodes to PyTorch's value (NaN codes to NaN; -0 keeps its sign);
  * every input converts to PyTorch's code. PyTorch's .to(float8) does not saturate (beyond the largest finite
    value it gives NaN for e4m3fn and inf for e5m2), so megatrain's saturating cast is compared with PyTorch's
    cast of the input clamped to [-max, max] (infinities clamp too, as __NV_SATFINITE does). NaN inputs must give
    a NaN code on both sides (megatrain writes 0x7f as CUDA does; PyTorch keeps the sign).
Exits 1 with the first mismatches listed, 0 when everything agrees.

    python check_fp8_torch.py FILE
"""
import struct
import sys

import torch

FORMATS = [("e4m3", torch.float8_e4m3fn, 448.0), ("e5m2", torch.float8_e5m2, 57344.0)]


def main(path):
    data = open(path, "rb").read()
    if data[:8] != b"MTFP8v1\n":
        sys.exit(f"{path}: not an fp8 dump (magic {data[:8]!r})")
    (n,) = struct.unpack_from("<Q", data, 8)
    at = 16

    def take(count, dtype, size):
        nonlocal at
        t = torch.frombuffer(bytearray(data[at:at + count * size]), dtype=dtype)
        at += count * size
        return t

    values = {name: take(256, torch.float32, 4) for name, _, _ in FORMATS}
    x = take(n, torch.float32, 4)
    codes = {name: take(n, torch.uint8, 1) for name, _, _ in FORMATS}
    if at != len(data):
        sys.exit(f"{path}: {len(data) - at} bytes left over (expected {at} bytes for n={n})")

    failures = 0

    def report(what, bad, detail):
        nonlocal failures
        count = int(bad.sum())
        print(f"{what}: {'ok' if count == 0 else f'{count} MISMATCHES'}")
        if count:
            failures += count
            for i in bad.nonzero().flatten()[:10].tolist():
                print("   ", detail(i))

    all_codes = torch.arange(256, dtype=torch.uint8)
    for name, tdt, vmax in FORMATS:
        # Every code's value, bit for bit (NaN codes: NaN on both sides).
        want = all_codes.view(tdt).float()
        got = values[name]
        both_nan = want.isnan() & got.isnan()
        bad = ~both_nan & (want.view(torch.int32) != got.view(torch.int32))
        report(f"{name}: value of each of the 256 codes", bad,
               lambda i: f"code 0x{i:02x}: megatrain {got[i].item()!r}, torch {want[i].item()!r}")

        # Every sweep input's code.
        nan_in = x.isnan()
        clamped = torch.where(nan_in, x, x.clamp(-vmax, vmax))
        want_codes = clamped.to(tdt).view(torch.uint8)
        got_codes = codes[name]
        got_nan = got_codes.view(tdt).float().isnan()
        want_nan = want_codes.view(tdt).float().isnan()
        bad_nan = nan_in & ~(got_nan & want_nan)
        bad = bad_nan | (~nan_in & (got_codes != want_codes))
        report(f"{name}: code of each of {n} float32 inputs ({int((x.abs() <= vmax).sum())} within range)", bad,
               lambda i: f"x={x[i].item()!r} (bits 0x{x.view(torch.int32)[i].item() & 0xffffffff:08x}): "
                         f"megatrain 0x{got_codes[i].item():02x}, torch (clamped) 0x{want_codes[i].item():02x}")
        # The sweep must exercise what it claims: both ties directions and saturation.
        if int((x.abs() > vmax).sum()) == 0 or int((x.abs() <= vmax).sum()) < 1000:
            print(f"{name}: the sweep is too thin")
            failures += 1

    print("PASS" if failures == 0 else f"FAIL: {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
