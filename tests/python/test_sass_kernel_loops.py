"""tools/sass/kernel_loops.py on hand-written SASS: which loop is the main one, and what it counts.

The script guides kernel work before GPU time is spent (docs/w4a16-gemm.md, v41), so a wrong count
would send a round after the wrong instructions. No cuobjdump is needed here.
"""
import importlib.util
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("kernel_loops", REPO / "tools" / "sass" / "kernel_loops.py")
kernel_loops = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel_loops)


def program(lines):
    """[(address, text)] at 16-byte steps, as cuobjdump numbers them."""
    return [(16 * i, text) for i, text in enumerate(lines)]


def test_the_loop_with_the_tensor_core_instructions_and_its_special_register_reads():
    code = program([
        "S2R R0, SR_TID.X",                      # 0x00: before the loops, not counted
        "CS2R R2, SRZ",                          # 0x10: zeroing, no special register
        "IADD3 R4, R4, 0x1, RZ",                 # 0x20: a loop without mma
        "@P0 BRA 0x20",                          # 0x30
        "S2UR UR4, SR_CgaCtaId",                 # 0x40: head of the main loop
        "S2R R5, SR_TID.X",                      # 0x50
        "CS2R R6, SRZ",                          # 0x60
        "HGMMA.64x64x16.F32 R24, R60, gdesc[UR16], R24",
        "HGMMA.64x64x16.F32 R24, R64, gdesc[UR16], R24, gsb0",
        "@!P1 BRA 0x40",                         # 0x90: back to 0x40, 6 instructions + itself
        "EXIT",
    ])
    assert kernel_loops.main_loop(code) == (2, 6, 2)


def test_an_outer_loop_around_an_unrolled_one_is_not_the_main_loop():
    code = program([
        "HMMA.16816.F32 R0, R4, R8, R0",         # 0x00: outer loop head
        "HMMA.16816.F32 R0, R4, R8, R0",         # 0x10: inner loop head
        "@P0 BRA 0x10",                          # 0x20: inner loop, 1 HMMA
        "HMMA.16816.F32 R0, R4, R8, R0",         # 0x30
        "@P1 BRA 0x0",                           # 0x40: outer loop spans the inner one
    ])
    assert kernel_loops.main_loop(code) == (1, 2, 0)


def test_no_loop_with_tensor_core_instructions():
    assert kernel_loops.main_loop(program(["IADD3 R0, R0, 0x1, RZ", "@P0 BRA 0x0"])) is None


def test_predicated_special_register_reads_count_and_zeroing_does_not():
    assert kernel_loops.is_special_register_read("@!P2 S2R R3, SR_CTAID.X")
    assert kernel_loops.is_special_register_read("S2UR UR5, SR_CgaCtaId")
    assert not kernel_loops.is_special_register_read("CS2R R20, SRZ")
    assert not kernel_loops.is_special_register_read("IMAD R4, R19, 0x10, R4")
