// Every numeric threshold of the test suites, in one place, each with the
// reason for its value. Tests compare against these names, never inline literals.
#pragma once

namespace lowbit::test {

// ---- round-to-nearest quantizer (lowbit/formats/rtn.h) ----------------------
// Bound checked: |w - dequant(w)| <= (0.5 + kRtnScaleSlack) * s + kRtnAbsSlack,
// s the stored f16 scale of w's group.
// Rounding s to f16 (relative error <= 2^-11) can leave the top of the range
// 15*|s_exact - s| <= 15*2^-11/(1 - 2^-11)*s = 0.00733*s beyond the grid; a w/s
// quotient at a tie may round either way in fp32 (+2^-24 relative). 2^-7 = 0.0078.
inline constexpr double kRtnScaleSlack = 0x1p-7;
// With a subnormal f16 scale the rounding error is absolute (<= 2^-25), so the
// overshoot is <= 15*2^-25; also covers the fp32 rounding of s*q + m itself
// for weights of magnitude <= 1 (2^-24 each).
inline constexpr double kRtnAbsSlack = 16 * 0x1p-25;
// The quantizer must actually use its grid: on normal random weights the
// largest error of a group is at least this fraction of s (a broken quantizer
// that returns, say, all zeros fails the bound; one that rounds too finely
// cannot exist with 16 levels, so this just checks the test is not vacuous).
inline constexpr double kRtnMinUsefulError = 0.25;

// ---- reference W4A16 GEMM (lowbit/w4a16/w4a16_gemm_ref.h) -------------------
// f32 output: per element |y - ref64| <= kGemmF32Rtol * sum_k |x[m,k] * w[k,n]|,
// where ref64 is the float64 product of the same fp32 x and dequantized w.
// A sequential fp32 sum of K terms errs by <= K*2^-24 of sum|terms| in the worst
// case (6.1e-5 at K = 1024) and ~sqrt(K)*2^-24 typically (1.9e-6 at K = 1024):
// 1e-5 holds with margin for the K <= 1024 the tests use, and a wrong term
// (e.g. a mis-grouped scale, relative change >= 1/16 of a term) breaks it.
inline constexpr double kGemmF32Rtol = 1e-5;
// Aggregate: ||y - ref64||_2 / ||ref64||_2 for f32 output.
inline constexpr double kGemmF32Nrmse = 1e-6;
// f16 / bf16 output adds one rounding of the fp32 result: half an ulp,
// 2^-11 (f16) and 2^-8 (bf16) relative to |ref|, on top of kGemmF32Rtol.
inline constexpr double kGemmF16OutRtol = 0x1p-11;
inline constexpr double kGemmBf16OutRtol = 0x1p-8;

// ---- CUDA W4A16 GEMM vs w4a16_gemm_ref (lowbit/w4a16/w4a16_gemm.h) ----------
// Per element |y - ref| <= rtol * (sum_k |x[m,k] * w[k,n]| + |ref|). The kernel
// rounds each dequantized weight to 16 bits once (f16: 2^-11 relative; bf16
// layouts also round the scale: 2 x 2^-8), accumulates in fp32 (tensor cores
// may drop the low bits of each product sum: well under 2^-11), and rounds the
// output once (2^-11 / 2^-8 of |ref|). The bounds below are those sums with a
// factor ~2 of margin; a mis-placed code or a wrong group scale changes a term
// by >= 1/16 of its size and fails them.
inline constexpr double kW4A16GemmF16Rtol = 0x1p-9;
inline constexpr double kW4A16GemmBf16Rtol = 0x1p-6;

// ---- act-order row sort (lowbit/formats/convert.h) ---------------------------
// y = x[:, perm] * W_sorted vs y = x * W computed in float64: the same terms
// summed in another order, so only float64 rounding differs (K*2^-53 of sum|terms|).
inline constexpr double kPermutedSumRtol = 1e-12;

}  // namespace lowbit::test
