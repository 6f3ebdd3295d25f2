#!/usr/bin/env python3
"""Static check of what the GPU executes: reads the sm_90 SASS of a fatbin
with cuobjdump and checks each kernel against device/fatbin/CHECKS.

Per kernel it reports registers and stack bytes (cuobjdump -res-usage),
the threads per block the kernel declares (the ELF attribute
EIATTR_REQNTID, else EIATTR_MAX_THREADS: __launch_bounds__), the
local-memory instructions (STL/LDL) and the global and generic memory
instructions by width and kind.

How an access is classed, from its SASS opcode:
- payload: a plain LDG/STG (global), LD/ST (generic) or LDGSTS with no
  memory-order qualifier. Width from the type suffix: U8/S8 8 bits,
  U16/S16 16, none 32, 64, 128. Plain loads and stores are what a copy or
  reduction of user data compiles to, so the narrow ones (< 128 bits) are
  counted against the kernel's budget: the head and tail elements of a
  buffer that is not 16-byte aligned, and nothing else.
- ordered: a load or store qualified .STRONG (relaxed, acquire, release or
  volatile in PTX) or .MMIO. These are the FIFO's head and tail counters
  and the flags of LL and LL128, whose 8-byte data+flag words must be
  stored whole; they are reported but not counted against the budget.
- atomic: ATOM, ATOMG, RED, REDG on global or generic memory (counters).
- local: STL/LDL, register spills or arrays the compiler put on the stack;
  a payload kernel has none.
Shared memory (LDS/STS/ATOMS) and constants (LDC) are not counted.

Counts are static: instructions in the code, not instructions executed, so
an unrolled loop counts once per copy.

Rules (each failure names the kernel):
  a. no STL/LDL;
  b. the declared threads per block at least CHECKS' minimum;
  c. narrow payload accesses at most CHECKS' budget.
Every kernel in the fatbin must match a CHECKS line and every CHECKS line
a kernel, so a new or renamed kernel is checked from its first build.

Usage: check_kernels.py CUOBJDUMP FATBIN CHECKS REPORT
Writes the markdown table to stdout and to REPORT; exits 1 when a rule
fails, 2 when the tools' output cannot be read.
"""

import fnmatch
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field

ARCH = "sm_90"
WIDTHS = (8, 16, 32, 64, 128)
WIDTH_OF_SUFFIX = {"U8": 8, "S8": 8, "U16": 16, "S16": 16, "64": 64, "128": 128}
PAYLOAD_OPS = {"LDG": "load", "LD": "load", "LDGSTS": "load", "STG": "store", "ST": "store"}
ATOMIC_OPS = {"ATOM", "ATOMG", "RED", "REDG"}
LOCAL_OPS = {"LDL", "STL"}
ORDER_QUALIFIERS = {"STRONG", "MMIO"}

FUNCTION = re.compile(r"^\s+Function : (\S+)")
# "/*0a30*/  @!P0 LDG.E.U8 R4, desc[UR4][R2.64] ;": the opcode after the
# address and an optional predicate.
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P(?:T|\d+)\s+)?([A-Z][A-Z0-9_.]*)")
RESOURCES = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+)")
INFO_SECTION = re.compile(r"^\.nv\.info\.(\S+)$")
THREAD_ATTRIBUTE = re.compile(r"Attribute:\s+EIATTR_(REQNTID|MAX_THREADS)\b")
VALUE = re.compile(r"Value:\s+((?:0x[0-9a-f]+\s*)+)")


class Unreadable(Exception):
    """cuobjdump's output is not what this script understands."""


@dataclass
class Kernel:
    name: str
    instructions: int = 0
    registers: int = 0
    stack: int = 0
    local: int = 0
    loads: Counter = field(default_factory=Counter)
    stores: Counter = field(default_factory=Counter)
    ordered_loads: int = 0
    ordered_stores: int = 0
    atomics: int = 0
    # (attribute, x*y*z) or None when the kernel declares no block size.
    threads: tuple[str, int] | None = None

    def narrow(self) -> int:
        return sum(n for c in (self.loads, self.stores) for w, n in c.items() if w < 128)


def cuobjdump(tool: str, fatbin: str, *options: str) -> str:
    run = subprocess.run(
        [tool, *options, "-arch", ARCH, fatbin], capture_output=True, text=True, check=False
    )
    if run.returncode != 0:
        raise Unreadable(f"cuobjdump {' '.join(options)}: {run.stderr.strip()}")
    return run.stdout


def width(opcode: str) -> int:
    sized = [WIDTH_OF_SUFFIX[s] for s in opcode.split(".")[1:] if s in WIDTH_OF_SUFFIX]
    if len(sized) > 1:
        raise Unreadable(f"{opcode}: more than one width")
    return sized[0] if sized else 32


def count_sass(sass: str) -> dict[str, Kernel]:
    kernels: dict[str, Kernel] = {}
    current = None
    for line in sass.splitlines():
        if m := FUNCTION.match(line):
            current = kernels.setdefault(m.group(1), Kernel(m.group(1)))
            continue
        m = INSTRUCTION.search(line)
        if not m or current is None:
            continue
        current.instructions += 1
        opcode = m.group(1)
        base, *qualifiers = opcode.split(".")
        if base in LOCAL_OPS:
            current.local += 1
        elif base in ATOMIC_OPS:
            current.atomics += 1
        elif base in PAYLOAD_OPS:
            kind = PAYLOAD_OPS[base]
            if ORDER_QUALIFIERS.intersection(qualifiers):
                if kind == "load":
                    current.ordered_loads += 1
                else:
                    current.ordered_stores += 1
            else:
                (current.loads if kind == "load" else current.stores)[width(opcode)] += 1
    if not kernels:
        raise Unreadable(f"no {ARCH} functions in the SASS listing")
    return kernels


def read_resources(text: str, kernels: dict[str, Kernel]) -> None:
    for name, regs, stack in RESOURCES.findall(text):
        if name in kernels:
            kernels[name].registers = int(regs)
            kernels[name].stack = int(stack)


def read_thread_attributes(elf: str, kernels: dict[str, Kernel]) -> None:
    """EIATTR_REQNTID (an exact block size) wins over EIATTR_MAX_THREADS
    (an upper bound) in each kernel's .nv.info section."""
    current = None
    pending = None
    for line in elf.splitlines():
        if m := INFO_SECTION.match(line):
            current, pending = kernels.get(m.group(1)), None
            continue
        if line.startswith("."):
            current, pending = None, None
        if current is None:
            continue
        if m := THREAD_ATTRIBUTE.search(line):
            pending = m.group(1)
        elif pending and (m := VALUE.search(line)):
            dims = [int(v, 16) for v in m.group(1).split()]
            if len(dims) != 3:
                raise Unreadable(f"{current.name}: EIATTR_{pending} {dims}")
            if current.threads is None or pending == "REQNTID":
                current.threads = (pending, dims[0] * dims[1] * dims[2])
            pending = None


def read_checks(path: str) -> list[tuple[str, int, int]]:
    rules = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) != 3 or not words[1].isdigit() or not words[2].isdigit():
                raise Unreadable(f"{path}:{number}: want 'kernel min-threads narrow-budget'")
            rules.append((words[0], int(words[1]), int(words[2])))
    return rules


def by_width(c: Counter) -> str:
    return " / ".join(str(c[w]) for w in WIDTHS)


def table(kernels: dict[str, Kernel]) -> str:
    head = (
        "| kernel | instrs | regs | stack B | STL+LDL | threads/block "
        "| payload loads 8/16/32/64/128 | payload stores 8/16/32/64/128 "
        "| ordered ld / st | atomics | narrow payload |"
    )
    rows = [head, "|" + " --- |" * 11]
    for k in kernels.values():
        threads = f"{k.threads[1]} ({k.threads[0].lower()})" if k.threads else "undeclared"
        rows.append(
            f"| {k.name} | {k.instructions} | {k.registers} | {k.stack} | {k.local} | {threads} "
            f"| {by_width(k.loads)} | {by_width(k.stores)} "
            f"| {k.ordered_loads} / {k.ordered_stores} | {k.atomics} | {k.narrow()} |"
        )
    return "\n".join(rows) + "\n"


def failures(kernels: dict[str, Kernel], rules: list[tuple[str, int, int]]) -> list[str]:
    found = []
    for pattern, _, _ in rules:
        if not any(fnmatch.fnmatchcase(name, pattern) for name in kernels):
            found.append(f"{pattern}: named in CHECKS but no kernel of the fatbin matches")
    for k in kernels.values():
        rule = next((r for r in rules if fnmatch.fnmatchcase(k.name, r[0])), None)
        if rule is None:
            found.append(f"{k.name}: no CHECKS line matches it; add its minimum and budget")
            continue
        _, min_threads, budget = rule
        if k.local:
            found.append(
                f"{k.name}: {k.local} local-memory instructions (STL/LDL: spills or stack "
                f"arrays, {k.stack} stack bytes); the data path must stay in registers"
            )
        if k.threads is None:
            found.append(
                f"{k.name}: declares no block size (__launch_bounds__ or reqntid), "
                f"CHECKS wants at least {min_threads} threads per block"
            )
        elif k.threads[1] < min_threads:
            found.append(
                f"{k.name}: {k.threads[1]} threads per block declared, "
                f"CHECKS wants at least {min_threads}"
            )
        if k.narrow() > budget:
            found.append(
                f"{k.name}: {k.narrow()} payload loads/stores narrower than 16 bytes "
                f"(loads {by_width(k.loads)}, stores {by_width(k.stores)} by 8/16/32/64/128 "
                f"bits), CHECKS allows {budget}"
            )
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 2
    tool, fatbin, checks, report = argv[1:]
    try:
        kernels = count_sass(cuobjdump(tool, fatbin, "-sass"))
        read_resources(cuobjdump(tool, fatbin, "-res-usage"), kernels)
        read_thread_attributes(cuobjdump(tool, fatbin, "-elf"), kernels)
        rules = read_checks(checks)
    except (Unreadable, OSError) as e:
        print(f"check-kernels: {e}", file=sys.stderr)
        return 2
    text = f"{fatbin}, {ARCH}\n\n{table(kernels)}"
    problems = failures(kernels, rules)
    if problems:
        text += "\nFAILED:\n" + "".join(f"- {p}\n" for p in problems)
    else:
        text += "\nAll kernels pass CHECKS.\n"
    with open(report, "w", encoding="utf-8") as f:
        f.write(text)
    print(text, end="")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
