#include "lowbit/kv/attention_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/core/parallel.h"
#include "span_checks.h"

namespace lowbit::kv {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

void check_q_heads(int num_q_heads, int num_kv_heads) {
  LOWBIT_CHECK_ARG(num_q_heads >= 1 && num_q_heads % num_kv_heads == 0, "num_q_heads", num_q_heads,
                   "a positive multiple of num_kv_heads = " + std::to_string(num_kv_heads));
}

float resolve_scale(float softmax_scale, int head_dim) {
  LOWBIT_CHECK_ARG(softmax_scale >= 0.0f && std::isfinite(softmax_scale), "softmax_scale", softmax_scale,
                   "0 (for 1/sqrt(head_dim)) or a positive finite value");
  return softmax_scale > 0.0f ? softmax_scale
                              : static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

std::string heads_shape(const char* rows, int64_t n, int heads_count, const char* heads, int head_dim) {
  // ostringstream rather than std::string operator+: GCC 12 at -O3 reports a
  // false -Wrestrict on chains of string concatenations.
  return lowbit::detail::concat("[", rows, " ", n, "][", heads, " ", heads_count, "][head_dim ", head_dim,
                                "]");
}

// Online-softmax state of one query head over a run of tokens, in fp32.
struct SoftmaxRun {
  float max = kNegInf;
  float sum = 0.0f;
  std::vector<float> acc;

  explicit SoftmaxRun(int head_dim) : acc(static_cast<size_t>(head_dim), 0.0f) {}

  // Adds token with scaled score `score` and value weight * unit.
  void add(float score, float weight, const float* unit) {
    const size_t d = acc.size();
    if (score > max) {
      const float rescale = std::exp(max - score);  // 0 for the first token (max = -inf)
      sum = sum * rescale + 1.0f;
      for (size_t j = 0; j < d; ++j) acc[j] = acc[j] * rescale + weight * unit[j];
      max = score;
    } else {
      const float p = std::exp(score - max);
      sum += p;
      const float w = p * weight;
      for (size_t j = 0; j < d; ++j) acc[j] += w * unit[j];
    }
  }
};

float dot(const float* a, const float* b, int n) {
  float s = 0.0f;
  for (int j = 0; j < n; ++j) s += a[j] * b[j];
  return s;
}

// The queries in K's stored domain: rotated when K is quantized.
std::vector<float> queries_in_key_domain(const PagedKvCache& cache, int layer, std::span<const float> q,
                                         int64_t rows) {
  std::vector<float> out(q.begin(), q.end());
  if (!cache.stored_rotated(KvPart::key)) return out;
  const Rotation& rotation = cache.rotation(layer);
  const size_t d = static_cast<size_t>(cache.config().head_dim);
  parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const std::span<float> row(out.data() + static_cast<size_t>(r) * d, d);
      rotation.rotate(row, row);
    }
  });
  return out;
}

// Un-rotates rows of `out` in place when V is stored rotated.
void values_to_original_domain(const PagedKvCache& cache, int layer, std::span<float> out, int64_t rows) {
  if (!cache.stored_rotated(KvPart::value)) return;
  const Rotation& rotation = cache.rotation(layer);
  const size_t d = static_cast<size_t>(cache.config().head_dim);
  parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const std::span<float> row(out.data() + static_cast<size_t>(r) * d, d);
      rotation.unrotate(row, row);
    }
  });
}

}  // namespace

DecodePartials paged_decode_partials_ref(const PagedKvCache& cache, int layer, std::span<const int> seqs,
                                         int num_q_heads, std::span<const float> q,
                                         const DecodeOptions& options) {
  const KvCacheConfig& c = cache.config();
  cache.check_layer(layer);
  check_q_heads(num_q_heads, c.num_kv_heads);
  LOWBIT_CHECK_ARG(!seqs.empty(), "seqs", "(empty)", "at least one sequence");
  LOWBIT_CHECK_ARG(options.split_tokens >= 0, "split_tokens", options.split_tokens,
                   "0 (no split) or positive");
  const float scale = resolve_scale(options.softmax_scale, c.head_dim);
  const int batch = static_cast<int>(seqs.size());
  const int d = c.head_dim;
  detail::check_span_size("q", q.size(), static_cast<size_t>(batch) * num_q_heads * d,
                          heads_shape("batch", batch, num_q_heads, "num_q_heads", d));
  int64_t longest = 0;
  for (int b = 0; b < batch; ++b) {
    cache.check_sequence(seqs[static_cast<size_t>(b)], "seqs[" + std::to_string(b) + "]");
    const int64_t len = cache.length(seqs[static_cast<size_t>(b)]);
    if (len == 0)
      fail(ErrorKind::invalid_argument, "invalid argument 'seqs[", b, "]' = ", seqs[static_cast<size_t>(b)],
           ": the sequence is empty; expected its current token written before decode attends to it");
    longest = std::max(longest, len);
  }

  DecodePartials part;
  part.batch = batch;
  part.num_q_heads = num_q_heads;
  part.head_dim = d;
  part.split_tokens = options.split_tokens > 0 ? options.split_tokens : longest;
  part.max_splits = static_cast<int>((longest + part.split_tokens - 1) / part.split_tokens);
  part.value_rotated = cache.stored_rotated(KvPart::value);
  const size_t splits = static_cast<size_t>(part.max_splits);
  part.out.assign(static_cast<size_t>(batch) * num_q_heads * splits * d, 0.0f);
  part.lse.assign(static_cast<size_t>(batch) * num_q_heads * splits, kNegInf);

  const std::vector<float> q_key =
      queries_in_key_domain(cache, layer, q, static_cast<int64_t>(batch) * num_q_heads);
  const int H = c.num_kv_heads;
  const int group = num_q_heads / H;
  const int64_t P = c.page_size;

  // One work item = (sequence, KV head, chunk): what one GPU CTA does.
  const int64_t items = static_cast<int64_t>(batch) * H * part.max_splits;
  parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> k_unit(static_cast<size_t>(d)), v_unit(static_cast<size_t>(d));
    for (int64_t item = begin; item < end; ++item) {
      const int split = static_cast<int>(item % part.max_splits);
      const int h = static_cast<int>((item / part.max_splits) % H);
      const int b = static_cast<int>(item / (static_cast<int64_t>(part.max_splits) * H));
      const int seq = seqs[static_cast<size_t>(b)];
      const int64_t len = cache.length(seq);
      const int64_t t0 = split * part.split_tokens;
      const int64_t t1 = std::min(len, t0 + part.split_tokens);
      if (t0 >= t1) continue;  // this sequence has fewer chunks: the partial stays empty
      const std::span<const int32_t> table = cache.block_table(seq);
      std::vector<SoftmaxRun> runs(static_cast<size_t>(group), SoftmaxRun(d));
      for (int64_t t = t0; t < t1; ++t) {
        const std::byte* slab = cache.slab(layer, table[static_cast<size_t>(t / P)], h);
        const int slot = static_cast<int>(t % P);
        const float k_scale = cache.decode_slot(KvPart::key, slab, slot, k_unit);
        const float v_scale = cache.decode_slot(KvPart::value, slab, slot, v_unit);
        for (int g = 0; g < group; ++g) {
          const int qh = h * group + g;
          const float* qv = q_key.data() + (static_cast<size_t>(b) * num_q_heads + qh) * d;
          const float score = dot(qv, k_unit.data(), d) * (k_scale * scale);
          runs[static_cast<size_t>(g)].add(score, v_scale, v_unit.data());
        }
      }
      for (int g = 0; g < group; ++g) {
        const SoftmaxRun& r = runs[static_cast<size_t>(g)];
        const size_t row = (static_cast<size_t>(b) * num_q_heads + h * group + g) * splits + split;
        part.lse[row] = r.max + std::log(r.sum);
        const float inv = 1.0f / r.sum;
        for (int j = 0; j < d; ++j) part.out[row * d + j] = r.acc[static_cast<size_t>(j)] * inv;
      }
    }
  });
  return part;
}

void merge_decode_partials_ref(const DecodePartials& p, std::span<float> out) {
  const size_t d = static_cast<size_t>(p.head_dim), splits = static_cast<size_t>(p.max_splits);
  const size_t rows = static_cast<size_t>(p.batch) * static_cast<size_t>(p.num_q_heads);
  detail::check_span_size("out", out.size(), rows * d,
                          heads_shape("batch", p.batch, p.num_q_heads, "num_q_heads", p.head_dim));
  detail::check_span_size("partials.lse", p.lse.size(), rows * splits, "[batch][num_q_heads][max_splits]");
  detail::check_span_size("partials.out", p.out.size(), rows * splits * d,
                          "[batch][num_q_heads][max_splits][head_dim]");
  for (size_t r = 0; r < rows; ++r) {
    const float* lse = p.lse.data() + r * splits;
    float m = kNegInf;
    for (size_t s = 0; s < splits; ++s) m = std::max(m, lse[s]);
    float* o = out.data() + r * d;
    std::fill(o, o + d, 0.0f);
    if (m == kNegInf) continue;  // no token at all (not reachable through paged_decode_partials_ref)
    float total = 0.0f;
    for (size_t s = 0; s < splits; ++s) {
      if (lse[s] == kNegInf) continue;
      const float w = std::exp(lse[s] - m);
      total += w;
      const float* chunk = p.out.data() + (r * splits + s) * d;
      for (size_t j = 0; j < d; ++j) o[j] += w * chunk[j];
    }
    const float inv = 1.0f / total;
    for (size_t j = 0; j < d; ++j) o[j] *= inv;
  }
}

void paged_decode_attention_ref(const PagedKvCache& cache, int layer, std::span<const int> seqs,
                                int num_q_heads, std::span<const float> q, std::span<float> out,
                                const DecodeOptions& options) {
  const DecodePartials partials = paged_decode_partials_ref(cache, layer, seqs, num_q_heads, q, options);
  merge_decode_partials_ref(partials, out);
  values_to_original_domain(cache, layer, out, static_cast<int64_t>(partials.batch) * num_q_heads);
}

void paged_prefill_attention_ref(const PagedKvCache& cache, int layer, int seq, int64_t first_pos,
                                 int64_t n_tokens, int num_q_heads, std::span<const float> q,
                                 std::span<float> out, float softmax_scale) {
  const KvCacheConfig& c = cache.config();
  cache.check_layer(layer);
  cache.check_sequence(seq);
  check_q_heads(num_q_heads, c.num_kv_heads);
  const float scale = resolve_scale(softmax_scale, c.head_dim);
  const int64_t len = cache.length(seq);
  LOWBIT_CHECK_ARG(n_tokens >= 1, "n_tokens", n_tokens, "at least 1");
  LOWBIT_CHECK_ARG(first_pos >= 0 && first_pos + n_tokens <= len, "first_pos", first_pos,
                   "first_pos + n_tokens (n_tokens = " + std::to_string(n_tokens) +
                       ") within the sequence's length " + std::to_string(len) +
                       " (write the block's K/V first)");
  const int d = c.head_dim, H = c.num_kv_heads, group = num_q_heads / H;
  const std::string shape = heads_shape("n_tokens", n_tokens, num_q_heads, "num_q_heads", d);
  const size_t expected =
      static_cast<size_t>(n_tokens) * static_cast<size_t>(num_q_heads) * static_cast<size_t>(d);
  detail::check_span_size("q", q.size(), expected, shape);
  detail::check_span_size("out", out.size(), expected, shape);

  // Decode every key and value the block can see once per KV head (a GPU
  // kernel decodes each K/V tile into shared memory once per query tile).
  const int64_t keys = first_pos + n_tokens;
  const size_t dd = static_cast<size_t>(d);
  std::vector<float> k_unit(static_cast<size_t>(keys) * H * dd), v_unit(k_unit.size());
  std::vector<float> k_scale(static_cast<size_t>(keys) * H), v_scale(k_scale.size());
  const std::span<const int32_t> table = cache.block_table(seq);
  const int64_t P = c.page_size;
  parallel_for(0, keys * H, 256, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / H;
      const int h = static_cast<int>(item % H);
      const std::byte* slab = cache.slab(layer, table[static_cast<size_t>(t / P)], h);
      const size_t at = static_cast<size_t>(item);
      k_scale[at] =
          cache.decode_slot(KvPart::key, slab, static_cast<int>(t % P), {k_unit.data() + at * dd, dd});
      v_scale[at] =
          cache.decode_slot(KvPart::value, slab, static_cast<int>(t % P), {v_unit.data() + at * dd, dd});
    }
  });

  const std::vector<float> q_key = queries_in_key_domain(cache, layer, q, n_tokens * num_q_heads);
  parallel_for(0, n_tokens * H, 4, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / H;
      const int h = static_cast<int>(item % H);
      const int64_t last = first_pos + i;  // causal: keys 0 .. last
      for (int g = 0; g < group; ++g) {
        const size_t row = static_cast<size_t>(i) * num_q_heads + static_cast<size_t>(h * group + g);
        const float* qv = q_key.data() + row * dd;
        SoftmaxRun run(d);
        for (int64_t t = 0; t <= last; ++t) {
          const size_t at = static_cast<size_t>(t) * H + static_cast<size_t>(h);
          const float score = dot(qv, k_unit.data() + at * dd, d) * (k_scale[at] * scale);
          run.add(score, v_scale[at], v_unit.data() + at * dd);
        }
        const float inv = 1.0f / run.sum;
        for (size_t j = 0; j < dd; ++j) out[row * dd + j] = run.acc[j] * inv;
      }
    }
  });
  values_to_original_domain(cache, layer, out, n_tokens * num_q_heads);
}

void dense_attention_ref(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                         int64_t n_queries, int64_t n_keys, int num_q_heads, int num_kv_heads, int head_dim,
                         std::span<float> out, float softmax_scale) {
  LOWBIT_CHECK_ARG(num_kv_heads >= 1, "num_kv_heads", num_kv_heads, "at least 1");
  check_q_heads(num_q_heads, num_kv_heads);
  LOWBIT_CHECK_ARG(head_dim >= 1, "head_dim", head_dim, "at least 1");
  LOWBIT_CHECK_ARG(n_queries >= 1, "n_queries", n_queries, "at least 1");
  LOWBIT_CHECK_ARG(
      n_keys >= n_queries, "n_keys", n_keys,
      "at least n_queries = " + std::to_string(n_queries) + " (queries are the last keys' positions)");
  const double scale = resolve_scale(softmax_scale, head_dim);
  const size_t dd = static_cast<size_t>(head_dim);
  const std::string q_shape = heads_shape("n_queries", n_queries, num_q_heads, "num_q_heads", head_dim);
  const std::string kv_shape = heads_shape("n_keys", n_keys, num_kv_heads, "num_kv_heads", head_dim);
  detail::check_span_size("q", q.size(), static_cast<size_t>(n_queries) * num_q_heads * dd, q_shape);
  detail::check_span_size("out", out.size(), static_cast<size_t>(n_queries) * num_q_heads * dd, q_shape);
  detail::check_span_size("k", k.size(), static_cast<size_t>(n_keys) * num_kv_heads * dd, kv_shape);
  detail::check_span_size("v", v.size(), static_cast<size_t>(n_keys) * num_kv_heads * dd, kv_shape);
  const int group = num_q_heads / num_kv_heads;
  parallel_for(0, n_queries * num_q_heads, 4, [&](int64_t begin, int64_t end) {
    std::vector<double> scores, acc(dd);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t i = item / num_q_heads;
      const int qh = static_cast<int>(item % num_q_heads);
      const int h = qh / group;
      const int64_t last = n_keys - n_queries + i;
      const float* qv = q.data() + static_cast<size_t>(item) * dd;
      scores.assign(static_cast<size_t>(last + 1), 0.0);
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t t = 0; t <= last; ++t) {
        const float* kv = k.data() + (static_cast<size_t>(t) * num_kv_heads + h) * dd;
        double s = 0.0;
        for (size_t j = 0; j < dd; ++j) s += static_cast<double>(qv[j]) * kv[j];
        scores[static_cast<size_t>(t)] = s * scale;
        m = std::max(m, s * scale);
      }
      double total = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t t = 0; t <= last; ++t) {
        const double p = std::exp(scores[static_cast<size_t>(t)] - m);
        total += p;
        const float* vv = v.data() + (static_cast<size_t>(t) * num_kv_heads + h) * dd;
        for (size_t j = 0; j < dd; ++j) acc[j] += p * vv[j];
      }
      for (size_t j = 0; j < dd; ++j)
        out[static_cast<size_t>(item) * dd + j] = static_cast<float>(acc[j] / total);
    }
  });
}

}  // namespace lowbit::kv
