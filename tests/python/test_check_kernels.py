"""How scripts/check_kernels.py classes SASS and applies CHECKS, on listings
written here in cuobjdump's spelling (no CUDA tools needed):
python3 -m unittest tests/python/test_check_kernels.py
"""
import pathlib
import sys
import tempfile
import unittest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
import check_kernels  # noqa: E402


def listing(name, *opcodes):
    lines = [f"\t\tFunction : {name}"]
    for at, opcode in enumerate(opcodes):
        lines.append(f"        /*{at * 16:04x}*/                   {opcode} ;   /* 0x0 */")
        lines.append("                                                   /* 0x0 */")
    return "\n".join(lines) + "\n"


ELF_BOUNDS = """
.nv.info.copy
\t<0x9>
\tAttribute:\tEIATTR_MAX_THREADS
\tFormat:\tEIFMT_SVAL
\tValue:\t0x200 0x1 0x1 

.nv.info.fifo
\tAttribute:\tEIATTR_REQNTID
\tFormat:\tEIFMT_SVAL
\tValue:\t0x80 0x1 0x1 
\tAttribute:\tEIATTR_MAX_THREADS
\tFormat:\tEIFMT_SVAL
\tValue:\t0x400 0x1 0x1 
"""


# The copy kernel's code: 0x00-0x6f its own, then copy_edge at 0x70 (two
# instructions) and ll_word_gather at 0x90 (one); the fifo kernel's
# section holds a function named like the copy kernel's edge, which must
# not class the copy kernel's code at those addresses.
ELF_SYMBOLS = """
.section .symtab
 index           value           size      info    other  shndx    name
 0x3               0               0      0x3        0   0x43     .text.copy
 0x8            0x70            0x20      0x2        0   0x43     $copy$_ZN4rccl9copy_edgeEPh
 0x9            0x90            0x10      0x2        0   0x43     $copy$_ZN4rccl14ll_word_gatherEPKh
 0xa            0xa0            0x10     0x22        0   0x43     $__internal_0_$__cuda_sm20_rem_u64
 0xe               0               0      0x3        0   0x44     .text.fifo
 0xf               0            0x80      0x2        0   0x44     $fifo$_ZN4rccl9copy_edgeEPh
"""


def budgets(narrow, edge=0, ll=0, local=0):
    return {"narrow": narrow, "edge": edge, "ll": ll, "local": local}


class Classify(unittest.TestCase):
    def setUp(self):
        functions = check_kernels.read_functions(ELF_SYMBOLS)
        self.kernels = check_kernels.count_sass(
            listing(
                "copy",
                "LDG.E.128 R4, desc[UR4][R2.64]",
                "STG.E.128 desc[UR4][R6.64], R4",
                "@!P0 LD.E.U8 R9, desc[UR4][R2.64]",
                "@P1 ST.E.U8 desc[UR4][R6.64], R9",
                "LDG.E.64.CONSTANT R10, desc[UR4][R2.64]",
                "LDC.64 R2, c[0x0][0x210]",
                "STS.128 [R3], R4",
                "LDG.E.U8 R9, desc[UR4][R2.64]",
                "STG.E.U8 desc[UR4][R6.64], R9",
                "LDG.E R9, desc[UR4][R2.64]",
                "LDG.E.64 R10, desc[UR4][R2.64]",
            )
            + listing(
                "fifo",
                "LDG.E.STRONG.SYS R4, desc[UR4][R2.64]",
                "STG.E.64.STRONG.SYS desc[UR4][R2.64], R8",
                "ATOMG.E.ADD.STRONG.GPU PT, R5, desc[UR4][R2.64], R4",
                "@P0 REDG.E.ADD.STRONG.GPU desc[UR4][R6.64], R13",
                "STL.64 [R1], R4",
                "LDL.64 R4, [R1]",
                "LDG.E.S16 R4, desc[UR4][R2.64]",
                "STG.E desc[UR4][R2.64], R4",
            ),
            functions,
        )
        check_kernels.read_thread_attributes(ELF_BOUNDS, self.kernels)

    def test_payload_by_width_and_kind(self):
        copy = self.kernels["copy"]
        self.assertEqual(copy.instructions, 11)
        self.assertEqual(copy.loads, {128: 1, 8: 2, 64: 2, 32: 1})
        self.assertEqual(copy.stores, {128: 1, 8: 2})
        self.assertEqual((copy.ordered_loads, copy.ordered_stores, copy.atomics), (0, 0, 0))

    def test_narrow_by_the_function_it_is_in(self):
        copy = self.kernels["copy"]
        self.assertEqual(copy.named, {"edge": 2, "ll": 1})
        # Outside named functions: the U8 pair and the 64-bit constant load
        # of the kernel's own code, and the 64-bit load in __internal_0_.
        self.assertEqual(copy.narrow(), 4)
        fifo = self.kernels["fifo"]
        self.assertEqual(fifo.named, {"edge": 2})
        self.assertEqual(fifo.narrow(), 0)

    def test_functions_by_kernel(self):
        functions = check_kernels.read_functions(ELF_SYMBOLS)
        self.assertEqual(
            [(a, b) for a, b, _ in functions["copy"]], [(0x70, 0x90), (0x90, 0xA0), (0xA0, 0xB0)]
        )
        self.assertEqual(functions["fifo"], [(0, 0x80, "_ZN4rccl9copy_edgeEPh")])

    def test_ordered_atomic_and_local_are_not_payload(self):
        fifo = self.kernels["fifo"]
        self.assertEqual((fifo.ordered_loads, fifo.ordered_stores), (1, 1))
        self.assertEqual(fifo.atomics, 2)
        self.assertEqual(fifo.local, 2)
        self.assertEqual(fifo.loads, {16: 1})
        self.assertEqual(fifo.stores, {32: 1})

    def test_declared_threads(self):
        self.assertEqual(self.kernels["copy"].threads, ("MAX_THREADS", 512))
        self.assertEqual(self.kernels["fifo"].threads, ("REQNTID", 128))

    def test_rules_name_the_kernel(self):
        problems = check_kernels.failures(
            self.kernels,
            [
                check_kernels.Rule("copy", 512, budgets(4, 2, 1)),
                check_kernels.Rule("fi*", 256, budgets(0, 2)),
            ],
        )
        self.assertEqual(len(problems), 2, problems)
        self.assertTrue(problems[0].startswith("fifo: 2 local-memory instructions"), problems)
        self.assertTrue(problems[1].startswith("fifo: 128 threads per block"), problems)
        self.assertFalse([p for p in problems if p.startswith("copy")], problems)

    def test_a_local_budget_admits_its_count_and_no_more(self):
        rules = lambda local: [
            check_kernels.Rule("copy", 512, budgets(4, 2, 1)),
            check_kernels.Rule("fi*", 128, budgets(0, 2, 0, local)),
        ]
        self.assertEqual(check_kernels.failures(self.kernels, rules(2)), [])
        problems = check_kernels.failures(self.kernels, rules(1))
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("fifo: 2 local-memory instructions", problems[0])
        self.assertIn("CHECKS allows 1", problems[0])

    def test_budget_undeclared_block_and_stale_lines(self):
        self.kernels["copy"].threads = None
        problems = check_kernels.failures(
            self.kernels,
            [check_kernels.Rule("copy", 512, budgets(3, 1, 0)), check_kernels.Rule("gone", 1, {})],
        )
        self.assertIn("gone: named in CHECKS but no kernel of the fatbin matches", problems)
        self.assertIn("fifo: no CHECKS line matches it; add its minimum and budgets", problems)
        self.assertTrue(any(p.startswith("copy: declares no block size") for p in problems))
        self.assertTrue(any(p.startswith("copy: 4 payload loads/stores narrower") for p in problems))
        in_functions = "narrow payload loads/stores in {} functions, CHECKS allows {}"
        self.assertIn("copy: 2 " + in_functions.format("edge", 1), problems)
        self.assertIn("copy: 1 " + in_functions.format("ll", 0), problems)

    def test_checks_lines_carry_every_budget(self):
        with tempfile.NamedTemporaryFile("w", suffix="CHECKS") as f:
            f.write("# comment\ncopy 512 0 4 2 1\n")
            f.flush()
            want = [check_kernels.Rule("copy", 512, budgets(0, 4, 2, 1))]
            self.assertEqual(check_kernels.read_checks(f.name), want)
            f.write("fifo 512 0 0 0\n")
            f.flush()
            with self.assertRaises(check_kernels.Unreadable):
                check_kernels.read_checks(f.name)


if __name__ == "__main__":
    unittest.main()
