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
  reduction of user data compiles to. A narrow one (< 128 bits) is
  counted by the function it sits in (the ELF symbol table gives each
  non-inlined device function's range of the kernel's code):
  - edge: in a function whose name holds "edge" (device/kernels mark
    them RCCL_NARROW): the unaligned head and tail of a range, a range
    whose ends disagree modulo 16, LL128's 8-byte last chunk of a line and
    its unaligned chunks, the one-element device scalar of PreMulSum;
  - LL: in a function whose name holds "ll_word": LL's 4 data bytes per
    8-byte data+flag word (the words themselves are stored and loaded
    whole with an order qualifier: "ordered" below);
  - narrow: anywhere else, counted against the kernel's narrow budget,
    0 for the kernels' Simple and LL128 paths.
- ordered: a load or store qualified .STRONG (relaxed, acquire, release or
  volatile in PTX) or .MMIO. These are the FIFO's head and tail counters
  and the flags of LL and LL128, whose 8-byte data+flag words must be
  stored whole; they are reported but not counted against the budget.
- atomic: ATOM, ATOMG, RED, REDG on global or generic memory (counters).
- local: STL/LDL, register spills or arrays the compiler put on the stack;
  a payload kernel should have none (ptxas counts the saves of values
  live across a call to an out-of-line edge function as spills).
Shared memory (LDS/STS/ATOMS) and constants (LDC) are not counted.

Counts are static: instructions in the code, not instructions executed, so
an unrolled loop counts once per copy.

Rules (each failure names the kernel):
  a. STL/LDL at most CHECKS' local budget (0 unless a line says why);
  b. the declared threads per block at least CHECKS' minimum;
  c. narrow, edge and LL accesses each at most CHECKS' budget for them.
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
# Narrow accesses in a function whose name holds one of these are counted
# apart, by class; the rest are "narrow".
NAMED_CLASSES = (("edge", "edge"), ("ll_word", "ll"))

FUNCTION = re.compile(r"^\s+Function : (\S+)")
# "/*0a30*/  @!P0 LDG.E.U8 R4, desc[UR4][R2.64] ;": the address, then the
# opcode after an optional predicate.
INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P(?:T|\d+)\s+)?([A-Z][A-Z0-9_.]*)")
# A row of the ELF symbol table: index, value, size, info, other, shndx,
# name. A kernel's code section is named ".text.<kernel>" (info 0x3); a
# function in it has info 0x2 or 0x22 and is named "$<kernel>$<function>"
# or "$__internal_<n>_$<function>".
SYMBOL = re.compile(
    r"^\s*0x[0-9a-f]+\s+(0x[0-9a-f]+|0)\s+(0x[0-9a-f]+|0)\s+(0x[0-9a-f]+|0)\s+\S+\s+"
    r"(0x[0-9a-f]+|0)\s+(\S+)\s*$"
)
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
    # Narrow payload accesses by NAMED_CLASSES' class.
    named: Counter = field(default_factory=Counter)
    ordered_loads: int = 0
    ordered_stores: int = 0
    atomics: int = 0
    # (attribute, x*y*z) or None when the kernel declares no block size.
    threads: tuple[str, int] | None = None

    def narrow(self) -> int:
        """Narrow payload accesses outside the named classes."""
        everywhere = sum(n for c in (self.loads, self.stores) for w, n in c.items() if w < 128)
        return everywhere - sum(self.named.values())


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


def read_functions(elf: str) -> dict[str, list[tuple[int, int, str]]]:
    """Per kernel, the (start, end, name) code ranges of the device
    functions compiled into its section."""
    kernel_of_section: dict[str, str] = {}
    functions: list[tuple[str, int, int, str]] = []
    for line in elf.splitlines():
        m = SYMBOL.match(line)
        if not m:
            continue
        value, size, info, section, name = m.groups()
        if info == "0x3" and name.startswith(".text."):
            kernel_of_section[section] = name[len(".text.") :]
        elif int(info, 16) & 0xF == 0x2 and name.startswith("$"):
            start = int(value, 16)
            functions.append((section, start, start + int(size, 16), name.rsplit("$", 1)[-1]))
    by_kernel: dict[str, list[tuple[int, int, str]]] = {}
    for section, start, end, name in functions:
        if section in kernel_of_section:
            by_kernel.setdefault(kernel_of_section[section], []).append((start, end, name))
    return by_kernel


def named_class(functions: list[tuple[int, int, str]], address: int) -> str | None:
    for start, end, name in functions:
        if start <= address < end:
            return next((c for marker, c in NAMED_CLASSES if marker in name), None)
    return None


def count_sass(sass: str, functions: dict[str, list[tuple[int, int, str]]]) -> dict[str, Kernel]:
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
        address, opcode = int(m.group(1), 16), m.group(2)
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
                bits = width(opcode)
                (current.loads if kind == "load" else current.stores)[bits] += 1
                named = named_class(functions.get(current.name, []), address)
                if bits < 128 and named:
                    current.named[named] += 1
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


@dataclass
class Rule:
    pattern: str
    min_threads: int
    # Most narrow accesses of each class: "narrow", then NAMED_CLASSES';
    # then the most local-memory instructions ("local").
    budgets: dict[str, int]


BUDGETS = ("narrow", *(c for _, c in NAMED_CLASSES), "local")


def read_checks(path: str) -> list[Rule]:
    rules = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            if len(words) != 2 + len(BUDGETS) or not all(w.isdigit() for w in words[1:]):
                raise Unreadable(
                    f"{path}:{number}: want 'kernel min-threads "
                    + " ".join(f"{b}-budget" for b in BUDGETS)
                    + "'"
                )
            numbers = [int(w) for w in words[1:]]
            rules.append(Rule(words[0], numbers[0], dict(zip(BUDGETS, numbers[1:]))))
    return rules


def by_width(c: Counter) -> str:
    return " / ".join(str(c[w]) for w in WIDTHS)


def table(kernels: dict[str, Kernel]) -> str:
    head = (
        "| kernel | instrs | regs | stack B | STL+LDL | threads/block "
        "| payload loads 8/16/32/64/128 | payload stores 8/16/32/64/128 "
        "| ordered ld / st | atomics | narrow payload | edge | LL |"
    )
    rows = [head, "|" + " --- |" * 13]
    for k in kernels.values():
        threads = f"{k.threads[1]} ({k.threads[0].lower()})" if k.threads else "undeclared"
        rows.append(
            f"| {k.name} | {k.instructions} | {k.registers} | {k.stack} | {k.local} | {threads} "
            f"| {by_width(k.loads)} | {by_width(k.stores)} "
            f"| {k.ordered_loads} / {k.ordered_stores} | {k.atomics} | {k.narrow()} "
            f"| {k.named['edge']} | {k.named['ll']} |"
        )
    return "\n".join(rows) + "\n"


def failures(kernels: dict[str, Kernel], rules: list[Rule]) -> list[str]:
    found = []
    for rule in rules:
        if not any(fnmatch.fnmatchcase(name, rule.pattern) for name in kernels):
            found.append(f"{rule.pattern}: named in CHECKS but no kernel of the fatbin matches")
    for k in kernels.values():
        rule = next((r for r in rules if fnmatch.fnmatchcase(k.name, r.pattern)), None)
        if rule is None:
            found.append(f"{k.name}: no CHECKS line matches it; add its minimum and budgets")
            continue
        min_threads = rule.min_threads
        if k.local > rule.budgets.get("local", 0):
            found.append(
                f"{k.name}: {k.local} local-memory instructions (STL/LDL: spills or stack "
                f"arrays, {k.stack} stack bytes), CHECKS allows "
                f"{rule.budgets.get('local', 0)}; the data path must stay in registers"
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
        if k.narrow() > rule.budgets["narrow"]:
            found.append(
                f"{k.name}: {k.narrow()} payload loads/stores narrower than 16 bytes outside "
                f"edge and LL functions (all payload: loads {by_width(k.loads)}, stores "
                f"{by_width(k.stores)} by 8/16/32/64/128 bits), CHECKS allows "
                f"{rule.budgets['narrow']}"
            )
        for _, named in NAMED_CLASSES:
            if k.named[named] > rule.budgets[named]:
                found.append(
                    f"{k.name}: {k.named[named]} narrow payload loads/stores in {named} "
                    f"functions, CHECKS allows {rule.budgets[named]}"
                )
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(__doc__.split("\n\n")[-1], file=sys.stderr)
        return 2
    tool, fatbin, checks, report = argv[1:]
    try:
        elf = cuobjdump(tool, fatbin, "-elf")
        kernels = count_sass(cuobjdump(tool, fatbin, "-sass"), read_functions(elf))
        read_resources(cuobjdump(tool, fatbin, "-res-usage"), kernels)
        read_thread_attributes(elf, kernels)
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
