// rANS (range asymmetric numeral systems) primitives shared by every
// entropy-coded format of lowbit/ans: the seed's MATVANS container
// (seed_format.h) and lowbit's interleaved GPU format (lowbit_format.h).
//
// Coder facts the formats rely on (the seed's coder, with the probability
// precision P generalised from 8 to 1..15 bits):
//   * the state x is an unsigned 32-bit integer; between symbols it lies in
//     [L, 2^32) with L = 2^16;
//   * renormalisation moves 16-bit words. The decoder reads one word,
//     x = (x << 16) | word, right after a symbol whenever x < 2^16. One read
//     always suffices: decoding maps x >= 2^16 to at least 2^(16-P) >= 1, and
//     one word lifts that to >= 2^(32-P) >= 2^16 (P <= 16);
//   * a model gives every symbol s a frequency f_s and a cumulative c_s with
//     sum f = 2^P; symbols that never occur may have f_s = 0;
//       decode: q = x mod 2^P; s = the symbol with c_s <= q < c_s + f_s;
//               x = f_s * (x >> P) + q - c_s
//       encode (the exact inverse; symbols are pushed in reverse order):
//               if x >= f_s * 2^(32-P): emit the word x mod 2^16, x >>= 16;
//               x = ((x / f_s) << P) + (x mod f_s) + c_s
//     The encoder's threshold keeps x < 2^32 after the push; the words it emits
//     are read by the decoder in the reverse order of emission;
//   * a fresh encoder starts at x = L = 2^16 (the seed's reference encoder
//     starts its AnsCoder from the words [0, 1], which is the same state), so
//     a decoder that consumed a whole stream ends at x = 2^16 exactly. The
//     readers use this, and the exact end of each stream's words, as an
//     integrity check;
//   * a symbol with f_s = 2^P (a one-symbol alphabet) costs nothing: both
//     directions leave x unchanged and the encoder never emits.
#pragma once

#include <cstdint>
#include <vector>

namespace lowbit::ans {

inline constexpr uint32_t kRansLowerBound = 1u << 16;  // L: states lie in [L, 2^32)
inline constexpr int kRansWordBits = 16;
inline constexpr int kRansMaxPrecision = 15;  // so that a frequency 2^P still fits in a u16

// Everything the encoder needs to push one symbol, precomputed per symbol.
struct RansEncSymbol {
  uint32_t freq = 0;   // f_s >= 1
  uint32_t cdf = 0;    // c_s
  uint64_t x_max = 0;  // f_s << (32 - P): push emits a word first when x >= x_max
};

inline RansEncSymbol rans_enc_symbol(uint32_t freq, uint32_t cdf, int precision) {
  return {freq, cdf, static_cast<uint64_t>(freq) << (32 - precision)};
}

// Pushes one symbol onto the state `x`, appending at most one word to `words`
// (emission order; decoders read the reverse).
inline void rans_encode(uint32_t& x, const RansEncSymbol& s, int precision, std::vector<uint16_t>& words) {
  if (x >= s.x_max) {
    words.push_back(static_cast<uint16_t>(x & 0xFFFFu));
    x >>= kRansWordBits;
  }
  const uint32_t q = x / s.freq;
  x = (q << precision) + (x - q * s.freq) + s.cdf;
}

// The decoder's state update for a symbol already identified from the low P
// bits of x; the caller then renormalises (reads a word when the result < L).
inline uint32_t rans_decode_advance(uint32_t x, uint32_t freq, uint32_t cdf, int precision) {
  const uint32_t mask = (1u << precision) - 1;
  return freq * (x >> precision) + (x & mask) - cdf;
}

}  // namespace lowbit::ans
