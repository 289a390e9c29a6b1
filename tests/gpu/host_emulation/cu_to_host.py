#!/usr/bin/env python3
"""Rewrites a .cu file of models/cuda/ into host C++ for the emulation: each launch
`kernel<<<grid, block, shared, stream>>>(args)` becomes `::emu::launch(kernel, grid, block, args)`
(`launch_synchronising` for kernels that call __syncthreads). Usage: cu_to_host.py FILE.cu > FILE.cpp"""
import re
import sys


def split_top_level(text):
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    parts.append(cur.strip())
    return parts


src = open(sys.argv[1]).read()
bodies = re.split(r"(?=__global__)", src)
synchronising = set()
for body in bodies:
    m = re.match(r"__global__\s+void\s+(\w+)", body)
    if m and "__syncthreads" in body:
        synchronising.add(m.group(1))

out, pos = "", 0
for m in re.finditer(r"(\w+)<<<(.*?)>>>\(", src, re.S):
    name, config = m.group(1), split_top_level(m.group(2))
    launcher = "launch_synchronising" if name in synchronising else "launch"
    out += src[pos:m.start()] + f"::emu::{launcher}({name}, dim3({config[0]}), dim3({config[1]}), "
    pos = m.end()
out += src[pos:]
print('#include "emulated_launch.hpp"\n' + out)
