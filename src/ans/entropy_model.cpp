#include "lowbit/ans/entropy_model.h"

#include "lowbit/ans/rans.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/core/parallel.h"

namespace lowbit::ans {

// ---- SymbolCounts -----------------------------------------------------------------

SymbolCounts SymbolCounts::of(std::span<const int8_t> data) {
  SymbolCounts total;
  std::mutex merge;
  // Counting is memory-bound; chunks of 1 MiB keep threads busy on big matrices
  // without starting threads for small ones.
  parallel_for(0, static_cast<int64_t>(data.size()), int64_t{1} << 20, [&](int64_t begin, int64_t end) {
    SymbolCounts local;
    for (int64_t i = begin; i < end; ++i) ++local.count[static_cast<size_t>(data[static_cast<size_t>(i)] + 128)];
    local.total = static_cast<uint64_t>(end - begin);
    std::lock_guard lock(merge);
    total.add(local);
  });
  return total;
}

void SymbolCounts::add(const SymbolCounts& other) {
  for (size_t i = 0; i < count.size(); ++i) count[i] += other.count[i];
  total += other.total;
}

int SymbolCounts::distinct() const {
  return static_cast<int>(std::count_if(count.begin(), count.end(), [](uint64_t c) { return c != 0; }));
}

int SymbolCounts::min_value() const {
  for (int v = -128; v <= 127; ++v)
    if (of_value(v) != 0) return v;
  return 0;
}

int SymbolCounts::max_value() const {
  for (int v = 127; v >= -128; --v)
    if (of_value(v) != 0) return v;
  return 0;
}

double SymbolCounts::entropy_bits() const {
  if (total == 0) return 0.0;
  const double n = static_cast<double>(total);
  double h = 0.0;
  for (uint64_t c : count)
    if (c != 0) h -= static_cast<double>(c) * std::log2(static_cast<double>(c) / n);
  return h / n;
}

// ---- FreqModel ------------------------------------------------------------------------

std::vector<uint32_t> FreqModel::cdf() const {
  std::vector<uint32_t> c(freq.size() + 1, 0);
  for (size_t i = 0; i < freq.size(); ++i) c[i + 1] = c[i] + freq[i];
  return c;
}

double FreqModel::cross_entropy_bits(const SymbolCounts& counts) const {
  if (counts.total == 0) return 0.0;
  double bits = 0.0;
  for (int v = -128; v <= 127; ++v) {
    const uint64_t c = counts.of_value(v);
    if (c == 0) continue;
    const int i = v - w_min;
    if (i < 0 || i >= grid_size() || freq[static_cast<size_t>(i)] == 0)
      fail_argument("counts", detail::concat("value ", v, " occurring ", c, " times"),
                    detail::concat("only values the model gives a probability (grid ", w_min, "..",
                                   w_min + grid_size() - 1, ")"));
    bits += static_cast<double>(c) * (precision - std::log2(static_cast<double>(freq[static_cast<size_t>(i)])));
  }
  return bits / static_cast<double>(counts.total);
}

void FreqModel::validate(std::string_view where) const {
  if (precision < 1 || precision > 15)
    fail(ErrorKind::format, where, ": probability precision = ", precision, " bits: expected 1..15");
  if (freq.empty() || freq.size() > 256)
    fail(ErrorKind::format, where, ": grid size = ", freq.size(), ": expected 1..256 symbols");
  if (w_min < -128 || w_min + grid_size() - 1 > 127)
    fail(ErrorKind::format, where, ": grid ", w_min, "..", w_min + grid_size() - 1,
         " leaves the int8 range -128..127");
  uint64_t sum = 0;
  for (uint32_t f : freq) sum += f;
  if (sum != (uint64_t{1} << precision))
    fail(ErrorKind::format, where, ": frequencies sum to ", sum, ": expected 2^", precision, " = ",
         uint64_t{1} << precision);
}

// ---- the lowbit model ----------------------------------------------------------------

namespace {

void check_counts(const SymbolCounts& counts) {
  if (counts.total == 0) fail_argument("counts", "empty (0 symbols)", "at least one symbol to model");
}

}  // namespace

FreqModel build_freq_model(const SymbolCounts& counts, int precision) {
  check_counts(counts);
  LOWBIT_CHECK_ARG(precision >= 1 && precision <= kRansMaxPrecision, "precision", precision,
                   "1..15 bits");
  const int distinct = counts.distinct();
  const uint64_t M = uint64_t{1} << precision;
  if (static_cast<uint64_t>(distinct) > M)
    fail_argument("precision", precision,
                  detail::concat("at least ", std::ceil(std::log2(distinct)), " bits: the data has ", distinct,
                                 " distinct values and each needs a frequency >= 1 of 2^P"));
  FreqModel m;
  m.precision = precision;
  m.w_min = counts.min_value();
  const int n = counts.max_value() - m.w_min + 1;
  m.freq.assign(static_cast<size_t>(n), 0);
  const double scale = static_cast<double>(M) / static_cast<double>(counts.total);
  int64_t sum = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t c = counts.of_value(m.w_min + i);
    if (c == 0) continue;
    const double f = std::max(1.0, std::nearbyint(static_cast<double>(c) * scale));
    m.freq[static_cast<size_t>(i)] = static_cast<uint32_t>(std::min(f, static_cast<double>(M)));
    sum += m.freq[static_cast<size_t>(i)];
  }
  // Cost of the data, as a function of f_i: -count_i * log2(f_i) (+ const).
  // Taking a unit from i costs count_i*log2(f_i/(f_i-1)); giving one gains
  // count_i*log2((f_i+1)/f_i). Fix the sum with the cheapest moves, then
  // exchange single units while that lowers the cost.
  constexpr double kInf = std::numeric_limits<double>::infinity();
  auto cost_down = [&](int i) {
    const uint32_t f = m.freq[static_cast<size_t>(i)];
    if (f <= 1) return kInf;  // present values keep >= 1; absent ones stay 0
    return static_cast<double>(counts.of_value(m.w_min + i)) *
           std::log2(static_cast<double>(f) / static_cast<double>(f - 1));
  };
  auto gain_up = [&](int i) {
    const uint32_t f = m.freq[static_cast<size_t>(i)];
    if (f == 0) return -kInf;
    return static_cast<double>(counts.of_value(m.w_min + i)) *
           std::log2(static_cast<double>(f + 1) / static_cast<double>(f));
  };
  auto best_down = [&] {
    int best = -1;
    double best_cost = kInf;
    for (int i = 0; i < n; ++i) {
      const double c = cost_down(i);
      if (c < best_cost) best_cost = c, best = i;
    }
    return std::pair{best, best_cost};
  };
  auto best_up = [&](int except) {
    int best = -1;
    double best_gain = -kInf;
    for (int i = 0; i < n; ++i) {
      if (i == except) continue;
      const double g = gain_up(i);
      if (g > best_gain) best_gain = g, best = i;
    }
    return std::pair{best, best_gain};
  };
  while (sum > static_cast<int64_t>(M)) {
    const auto [i, cost] = best_down();
    if (i < 0) fail(ErrorKind::internal, "build_freq_model: no frequency can shrink (sum ", sum, ")");
    --m.freq[static_cast<size_t>(i)];
    --sum;
  }
  while (sum < static_cast<int64_t>(M)) {
    const auto [i, gain] = best_up(-1);
    ++m.freq[static_cast<size_t>(i)];
    ++sum;
  }
  // Exchange: bounded, because every accepted move strictly lowers a cost that
  // is bounded below; the cap only guards against float ties cycling.
  for (int round = 0; round < 1 << 16; ++round) {
    const auto [down, cost] = best_down();
    if (down < 0) break;
    const auto [up, gain] = best_up(down);
    if (up < 0 || !(gain > cost * (1 + 1e-12))) break;
    --m.freq[static_cast<size_t>(down)];
    ++m.freq[static_cast<size_t>(up)];
  }
  return m;
}

// ---- the seed's model ------------------------------------------------------------

FreqModel build_seed_model(const SymbolCounts& counts) {
  check_counts(counts);
  FreqModel m;
  m.precision = 8;
  const int lo = counts.min_value(), hi = counts.max_value();
  m.w_min = lo;
  if (lo == hi) {
    m.freq = {255, 1};
    return m;
  }
  const int grid = hi - lo + 1;
  if (grid > 255)
    fail(ErrorKind::unsupported, "the seed's 8-bit model: the values span ", lo, "..", hi, " (", grid,
         " grid points) but |G| is stored as a u8: at most 255 grid points");
  struct Entry {
    int value;
    uint64_t count;
    int64_t prob;
  };
  std::vector<Entry> entries;
  for (int v = hi; v >= lo; --v)  // larger values first, so the stable sort breaks ties that way
    if (counts.of_value(v) != 0) entries.push_back({v, counts.of_value(v), 0});
  std::stable_sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.count > b.count; });
  const double scale = 256.0 / static_cast<double>(counts.total);
  int64_t sum = 0;
  for (Entry& e : entries) {
    e.prob = std::max<int64_t>(1, static_cast<int64_t>(std::nearbyint(static_cast<double>(e.count) * scale)));
    sum += e.prob;
  }
  int64_t excess = sum - 256;
  while (excess > 0) {
    int64_t reducible = 0;
    for (const Entry& e : entries) reducible += e.prob > 1 ? 1 : 0;
    if (reducible == 0) fail(ErrorKind::internal, "build_seed_model: cannot shed ", excess, " units");
    int64_t take = std::min(excess, reducible);
    excess -= take;
    for (Entry& e : entries) {
      if (take == 0) break;
      if (e.prob > 1) --e.prob, --take;
    }
  }
  if (excess < 0) {
    if (-excess > static_cast<int64_t>(entries.size()))
      fail(ErrorKind::internal, "build_seed_model: deficit ", -excess, " exceeds ", entries.size(), " entries");
    for (size_t k = entries.size() - static_cast<size_t>(-excess); k < entries.size(); ++k) ++entries[k].prob;
  }
  m.freq.assign(static_cast<size_t>(grid), 0);
  for (const Entry& e : entries) m.freq[static_cast<size_t>(e.value - lo)] = static_cast<uint32_t>(e.prob);
  return m;
}

SeedTables seed_tables(const FreqModel& model) {
  LOWBIT_CHECK_ARG(model.precision == 8, "model.precision", model.precision, "8 (the seed's tables are 8-bit)");
  LOWBIT_CHECK_ARG(model.grid_size() >= 2 && model.grid_size() <= 255, "model grid size", model.grid_size(),
                   "2..255 (|G| is a u8, and one symbol alone would need probability 256)");
  SeedTables t;
  t.cdf.resize(static_cast<size_t>(model.grid_size()) + 1);
  uint32_t c = 0;
  for (int i = 0; i < model.grid_size(); ++i) {
    const uint32_t f = model.freq[static_cast<size_t>(i)];
    LOWBIT_CHECK_ARG(f <= 255, "model.freq[" + std::to_string(i) + "]", f,
                     "<= 255 (the seed decodes f = (cdf[i+1] - cdf[i]) mod 256)");
    t.cdf[static_cast<size_t>(i)] = static_cast<uint8_t>(c);
    for (uint32_t q = c; q < c + f; ++q) t.ppf[q] = static_cast<uint8_t>(i);
    c += f;
  }
  LOWBIT_CHECK_ARG(c == 256, "model frequency sum", c, "256");
  t.cdf.back() = 0;  // 256 mod 256
  return t;
}

FreqModel model_from_seed_tables(int w_min, std::span<const uint8_t> cdf, std::span<const uint8_t> ppf,
                                 std::string_view where) {
  const size_t G = cdf.empty() ? 0 : cdf.size() - 1;
  if (G < 2)
    fail(ErrorKind::format, where, ": |G| = ", G,
         ": expected at least 2 grid points (a single symbol would need probability 256, which 8 bits cannot hold)");
  if (w_min + static_cast<int>(G) - 1 > 127)
    fail(ErrorKind::format, where, ": w_min = ", w_min, " with |G| = ", G, " reaches ",
         w_min + static_cast<int>(G) - 1, ", beyond the int8 maximum 127");
  if (cdf[0] != 0) fail(ErrorKind::format, where, ": cdf[0] = ", int{cdf[0]}, ": expected 0");
  if (cdf[G] != 0)
    fail(ErrorKind::format, where, ": cdf[", G, "] = ", int{cdf[G]}, ": expected 0 (the total 256, stored mod 256)");
  if (ppf.size() != 256) fail(ErrorKind::internal, where, ": ppf has ", ppf.size(), " entries");
  FreqModel m;
  m.precision = 8;
  m.w_min = w_min;
  m.freq.resize(G);
  for (size_t i = 0; i < G; ++i) {
    const uint32_t next = i + 1 == G ? 256u : cdf[i + 1];
    if (next < cdf[i])
      fail(ErrorKind::format, where, ": cdf[", i + 1, "] = ", int{cdf[i + 1]}, " < cdf[", i, "] = ", int{cdf[i]},
           ": expected a non-decreasing table");
    if (next - cdf[i] > 255)
      fail(ErrorKind::format, where, ": symbol ", i, " (value ", w_min + static_cast<int>(i),
           ") has probability 256/256 (cdf[", i, "] = 0): expected at most 255 (the seed decodes it as 0)");
    m.freq[i] = next - cdf[i];
  }
  const std::vector<uint32_t> c = m.cdf();
  for (uint32_t q = 0; q < 256; ++q) {
    const uint32_t s = ppf[q];
    if (s >= G || !(c[s] <= q && q < c[s + 1])) {
      uint32_t want = 0;
      while (!(c[want] <= q && q < c[want + 1])) ++want;
      fail(ErrorKind::format, where, ": ppf[", q, "] = ", s, ": expected ", want, " (the symbol whose cdf interval [",
           c[want], ", ", c[want + 1], ") holds ", q, ")");
    }
  }
  return m;
}

}  // namespace lowbit::ans
