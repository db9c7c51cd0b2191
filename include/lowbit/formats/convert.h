// Conversions between the zero-point conventions of a QuantizedLinear, and the
// act-order row sort. Conversions between packed layouts go through the
// canonical QuantizedLinear: see repack() in lowbit/formats/layout_registry.h.
//
// Layout facts this header relies on (see quantized_linear.h):
//  - symmetric == integer with every z = 8;
//  - integer z  <-> float_min m = -(s*z) computed in fp32, exact because s is
//    an f16 and z <= 15; the reverse needs -m/s to be an integer z in 0..15
//    with -(s*z) == m bit for bit;
//  - g_idx[k] is the group of row k; empty means k / group_size.
#pragma once

#include <cstdint>
#include <vector>

#include "lowbit/formats/quantized_linear.h"

namespace lowbit::formats {

// The same layer in another zero-point convention, with bit-identical
// dequantized weights. Throws Error(invalid_argument) naming the group, the
// column and the value when a zero or min cannot be represented exactly:
//   integer -> symmetric   needs every z == 8;
//   float_min -> integer   needs m == -(s*z) for an integer z in 0..15
//                          (for s == 0 and m == 0 any z works: z = 8 is used);
//   float_min -> symmetric needs the above with z == 8.
QuantizedLinear to_zero_point(const QuantizedLinear& layer, ZeroPoint target);

struct SortedRows {
  QuantizedLinear sorted;     // g_idx empty: row i is in group i / group_size
  std::vector<int32_t> perm;  // [K], a permutation of 0..K-1
};

// Reorders the rows of an act-order layer so that its groups are contiguous.
// Contract: perm is the stable sort of 0..K-1 by g_idx (rows of one group keep
// their relative order), sorted.codes row i == layer.codes row perm[i], the
// scales/zeros/mins are unchanged, and for every x [M, K]:
//
//     y = x[:, perm] * dequant(sorted)  ==  x * dequant(layer)
//
// i.e. a kernel on the sorted layer reads activation column perm[i] where it
// would read column i (vLLM's marlin_sort_g_idx + activation permutation,
// ExLlama's make_sequential). The sums have the same terms in another order.
// A layer with empty or trivial g_idx returns itself and the identity.
// Throws Error(invalid_argument) when a group does not hold exactly
// group_size rows (then no sorted layout has a trivial g_idx).
SortedRows sort_rows_by_group(const QuantizedLinear& layer);

}  // namespace lowbit::formats
