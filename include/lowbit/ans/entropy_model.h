// Entropy models for int8 weights: symbol statistics, the seed's 8-bit
// quantile model, and lowbit's higher-precision frequency model.
//
// Facts this header relies on:
//   * a model covers the contiguous grid of int8 values w_min .. w_min + n - 1
//     ("symbol" i is the value w_min + i), one model per matrix (per tensor);
//   * a model of precision P gives each symbol a frequency f_i in 0..2^P with
//     sum f = 2^P; a value that occurs in the data must have f_i >= 1, so a
//     P-bit model holds at most 2^P live symbols and costs at most P bits per
//     symbol; the cost of the data under it (its cross-entropy) is
//     sum_i count_i * (P - log2 f_i) bits;
//   * the seed's model (MATVANS report section 1.3, its create_matfiles.py) is
//     a P = 8 model stored as two byte tables: cdf u8[|G|+1] holding the LOW 8
//     bits of the cumulative frequencies (so cdf[|G|] = 256 is stored as 0 and
//     f_i = (cdf[i+1] - cdf[i]) mod 256), and ppf u8[256], ppf[q] = the symbol
//     i with cdf_i <= q < cdf_i + f_i. Its frequencies come from the counts as
//     the reference encoder computes them (see build_seed_model below).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

namespace lowbit::ans {

// Occurrences of every int8 value in some data.
struct SymbolCounts {
  std::array<uint64_t, 256> count{};  // count[v + 128] for the value v
  uint64_t total = 0;

  static SymbolCounts of(std::span<const int8_t> data);  // multithreaded for large data
  void add(const SymbolCounts& other);
  uint64_t of_value(int v) const { return count[static_cast<size_t>(v + 128)]; }
  int distinct() const;  // values with a non-zero count
  int min_value() const;  // smallest value present; 0 when total == 0
  int max_value() const;
  // Empirical (Shannon) entropy in bits per symbol; 0 for empty data.
  double entropy_bits() const;
};

// A frequency model of precision P over the grid w_min .. w_min + freq.size() - 1.
struct FreqModel {
  int precision = 0;            // P, 1..15
  int w_min = 0;                // the value of symbol 0
  std::vector<uint32_t> freq;   // f_i, sum 2^P

  int grid_size() const { return static_cast<int>(freq.size()); }
  // cumulative frequencies, cdf[0] = 0, cdf[i+1] = cdf[i] + f_i (size grid_size() + 1).
  std::vector<uint32_t> cdf() const;
  // Cross-entropy of the counted data under this model, in bits per symbol.
  // Throws Error(invalid_argument) naming a value that occurs in `counts` but
  // has no probability in the model.
  double cross_entropy_bits(const SymbolCounts& counts) const;
  // Throws Error(format) naming `where` and the offending field unless the
  // model is well formed: P in 1..15, 1 <= grid_size, w_min and the top of the
  // grid within int8, frequencies summing to 2^P.
  void validate(std::string_view where) const;
};

// The lowbit model: frequencies of precision `precision` (1..15) that minimise
// the cross-entropy of `counts` among all models giving every present value a
// frequency >= 1 (round counts*2^P/total, then exchange units of frequency
// greedily while that lowers the cost: the cost is separable and convex in
// each f_i, so the exchange reaches the optimum). Ties go to the lower value.
// The grid runs from the smallest to the largest present value. Throws
// Error(invalid_argument) for empty counts, a precision outside 1..15, or more
// distinct values than 2^P.
FreqModel build_freq_model(const SymbolCounts& counts, int precision);

// The seed's 8-bit model, as the reference encoder builds it:
//   * one value only: grid size 2, frequencies [255, 1] (ANS needs a second
//     symbol with non-zero probability: the reference adds a dummy);
//   * otherwise the grid is min..max, and, with the present values sorted by
//     count, descending (ties: the larger value first, which is what numpy's
//     argsort(counts)[::-1] gives for a stable sort; the reference's sort is
//     not stable, so files whose largest or smallest counts tie may differ
//     from the reference's in which tied entry absorbs a correction), each
//     gets f = max(1, round_half_even(count * (256 / total))); a sum above 256
//     is cut by repeatedly taking one unit from each of the first entries that
//     still hold more than 1 (as many as the excess, front first); a sum
//     below 256 gives one more unit to each of the last (least probable)
//     entries.
// Throws Error(invalid_argument) for empty counts and Error(unsupported) when
// the values span all 256 int8 codes (|G| is a u8 in the seed format).
FreqModel build_seed_model(const SymbolCounts& counts);

// The seed's two byte tables of an 8-bit model.
struct SeedTables {
  std::vector<uint8_t> cdf;      // |G| + 1 entries, low 8 bits of the cumulative frequencies
  std::array<uint8_t, 256> ppf{};
};
// Throws Error(invalid_argument) unless `model` is an 8-bit model with a grid
// of 2..255 symbols and every frequency <= 255.
SeedTables seed_tables(const FreqModel& model);
// The 8-bit model stored in seed tables, after checking them: cdf[0] = 0, the
// stored cdf non-decreasing with cdf[|G|] = 0 standing for 256, every
// frequency <= 255, and ppf exactly the inverse of the cdf. Throws
// Error(format) naming `where`, the table, the index and the values.
FreqModel model_from_seed_tables(int w_min, std::span<const uint8_t> cdf, std::span<const uint8_t> ppf,
                                 std::string_view where);

}  // namespace lowbit::ans
