"""How scripts/check_kernels.py classes SASS and applies CHECKS, on listings
written here in cuobjdump's spelling (no CUDA tools needed):
python3 -m unittest tests/python/test_check_kernels.py
"""
import pathlib
import sys
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


class Classify(unittest.TestCase):
    def setUp(self):
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
            )
        )
        check_kernels.read_thread_attributes(ELF_BOUNDS, self.kernels)

    def test_payload_by_width_and_kind(self):
        copy = self.kernels["copy"]
        self.assertEqual(copy.instructions, 7)
        self.assertEqual(copy.loads, {128: 1, 8: 1, 64: 1})
        self.assertEqual(copy.stores, {128: 1, 8: 1})
        self.assertEqual(copy.narrow(), 3)
        self.assertEqual((copy.ordered_loads, copy.ordered_stores, copy.atomics), (0, 0, 0))

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
        problems = check_kernels.failures(self.kernels, [("copy", 512, 3), ("fi*", 256, 2)])
        self.assertEqual(len(problems), 2, problems)
        self.assertTrue(problems[0].startswith("fifo: 2 local-memory instructions"), problems)
        self.assertTrue(problems[1].startswith("fifo: 128 threads per block"), problems)
        self.assertFalse([p for p in problems if p.startswith("copy")], problems)

    def test_budget_undeclared_block_and_stale_lines(self):
        self.kernels["copy"].threads = None
        problems = check_kernels.failures(self.kernels, [("copy", 512, 2), ("gone", 1, 0)])
        self.assertIn("gone: named in CHECKS but no kernel of the fatbin matches", problems)
        self.assertIn("fifo: no CHECKS line matches it; add its minimum and budget", problems)
        self.assertTrue(any(p.startswith("copy: declares no block size") for p in problems))
        self.assertTrue(any(p.startswith("copy: 3 payload loads/stores narrower") for p in problems))


if __name__ == "__main__":
    unittest.main()
