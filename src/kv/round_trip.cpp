#include "lowbit/kv/round_trip.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/parallel.h"
#include "lowbit/kv/counter_rng.h"

namespace lowbit::kv {

namespace {

struct BlockSums {
  double relative_mse = 0, cosine = 0, cosine_min = 2, ip_error = 0, ip_error2 = 0;
};

constexpr int64_t kBlockVectors = 1024;

}  // namespace

RoundTripReport measure_round_trip(const RoundTripOptions& o) {
  LOWBIT_CHECK_ARG(o.n >= 1 && o.n <= 10'000'000, "n", o.n, "1 to 10,000,000 vectors");
  check_kv_head_dim(o.dim, o.rotation, "dim");
  const VectorQuantizer quantizer(o.bits, o.dim, o.quantizer);
  const Rotation rotation = Rotation::make(o.rotation, o.dim, layer_rotation_seed(o.rotation_seed_base, 0));
  const size_t d = static_cast<size_t>(o.dim);
  const int64_t blocks = (o.n + kBlockVectors - 1) / kBlockVectors;
  std::vector<BlockSums> sums(static_cast<size_t>(blocks));

  parallel_for(0, blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> x(d), y(d), back(d);
    std::vector<uint8_t> codes(quantizer.code_bytes());
    std::vector<std::byte> scale(quantizer.scale_bytes());
    for (int64_t block = begin; block < end; ++block) {
      BlockSums& s = sums[static_cast<size_t>(block)];
      const int64_t last = std::min(o.n, (block + 1) * kBlockVectors);
      for (int64_t i = block * kBlockVectors; i < last; ++i) {
        for (size_t j = 0; j < d; ++j) {
          x[j] = static_cast<float>(random_normal(o.seed, static_cast<uint64_t>(i) * d + j));
          y[j] = static_cast<float>(random_normal(o.seed, static_cast<uint64_t>(o.n + i) * d + j));
        }
        quantizer.quantize(rotation, x, codes, scale);
        quantizer.dequantize(rotation, codes, scale, back);
        double xx = 0, yy = 0, bb = 0, err = 0, xb = 0, yx = 0, yb = 0;
        for (size_t j = 0; j < d; ++j) {
          const double xj = x[j], bj = back[j], yj = y[j];
          xx += xj * xj;
          yy += yj * yj;
          bb += bj * bj;
          err += (xj - bj) * (xj - bj);
          xb += xj * bj;
          yx += yj * xj;
          yb += yj * bj;
        }
        s.relative_mse += err / xx;
        const double cosine = xb / std::sqrt(xx * bb);
        s.cosine += cosine;
        s.cosine_min = std::min(s.cosine_min, cosine);
        const double ip = (yb - yx) / std::sqrt(yy * xx);
        s.ip_error += ip;
        s.ip_error2 += ip * ip;
      }
    }
  });

  BlockSums total;
  for (const BlockSums& s : sums) {
    total.relative_mse += s.relative_mse;
    total.cosine += s.cosine;
    total.cosine_min = std::min(total.cosine_min, s.cosine_min);
    total.ip_error += s.ip_error;
    total.ip_error2 += s.ip_error2;
  }
  const double n = static_cast<double>(o.n);
  RoundTripReport r;
  r.relative_mse = total.relative_mse / n;
  r.theory_mse = quantizer.codebook().unit_vector_mse;
  r.cosine_mean = total.cosine / n;
  r.cosine_min = total.cosine_min;
  r.ip_bias = total.ip_error / n;
  r.ip_rmse = std::sqrt(total.ip_error2 / n);
  r.ip_rmse_theory = std::sqrt(r.theory_mse / o.dim);
  r.code_bytes = static_cast<int64_t>(quantizer.code_bytes());
  r.scale_bytes = static_cast<int64_t>(quantizer.scale_bytes());
  r.bytes_per_vector = r.code_bytes + r.scale_bytes;
  return r;
}

}  // namespace lowbit::kv
