#include "lowbit/engine/kv_store.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <sstream>
#include <vector>

#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/engine/cpu_kernels.h"
#include "lowbit/kv/attention_ref.h"
#include "lowbit/kv/paged_cache.h"

namespace lowbit::engine {

const char* kv_storage_name(KvStorage s) {
  switch (s) {
    case KvStorage::fp32: return "fp32";
    case KvStorage::fp16: return "fp16";
    case KvStorage::tq4: return "tq4";
    case KvStorage::tq3: return "tq3";
    case KvStorage::tq2: return "tq2";
  }
  return "?";
}

std::optional<KvStorage> parse_kv_storage(std::string_view name) {
  for (KvStorage s : {KvStorage::fp32, KvStorage::fp16, KvStorage::tq4, KvStorage::tq3, KvStorage::tq2})
    if (name == kv_storage_name(s)) return s;
  return std::nullopt;
}

void KvOptions::validate() const {
  if ((k == KvStorage::fp32) != (v == KvStorage::fp32))
    fail_argument("kv", describe(), "fp32 for both K and V or for neither (the paged cache stores fp16 or tq)");
  LOWBIT_CHECK_ARG(max_tokens > 0, "max_tokens", max_tokens, "a positive count");
  LOWBIT_CHECK_ARG(max_sequences > 0, "max_sequences", max_sequences, "a positive count");
  LOWBIT_CHECK_ARG(fp16_window >= 0, "fp16_window", fp16_window, "a count of tokens, 0 or more");
  if (fp16_window > 0 && reference_attention)
    fail_argument("fp16_window", fp16_window, "0 with reference_attention (the kv module's kernels have no window)");
}

bool KvOptions::has_fp16_window() const {
  const auto dense = [](KvStorage s) { return s == KvStorage::fp32 || s == KvStorage::fp16; };
  return fp16_window > 0 && !(dense(k) && dense(v));
}

std::string KvOptions::describe() const {
  std::string s = std::string("K ") + kv_storage_name(k) + ", V " + kv_storage_name(v);
  if (has_fp16_window()) s += ", newest " + std::to_string(fp16_window) + " tokens also fp16";
  return s;
}

namespace {

// ---- dense: fp32 or fp16, per sequence [token][kv_head][head_dim] --------------------

template <typename T>
T store(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else return float_to_f16(v);
}

template <typename T>
class DenseKvStore final : public KvStore {
 public:
  DenseKvStore(const ModelConfig& c, const KvOptions& o) : config_(c), options_(o) {}

  int add_sequence() override {
    for (size_t i = 0; i < seqs_.size(); ++i)
      if (!seqs_[i].active) {
        seqs_[i] = make_seq();
        return static_cast<int>(i);
      }
    if (seqs_.size() >= static_cast<size_t>(options_.max_sequences))
      fail(ErrorKind::invalid_argument, "KV cache: all ", options_.max_sequences, " sequences are in use");
    seqs_.push_back(make_seq());
    return static_cast<int>(seqs_.size() - 1);
  }
  void release_sequence(int seq) override { get(seq) = Seq{}; }
  int64_t extend(int seq, int64_t n) override {
    Seq& s = get(seq);
    LOWBIT_CHECK_ARG(n >= 1, "n_tokens", n, "at least 1");
    if (s.length + n > options_.max_tokens)
      fail(ErrorKind::invalid_argument, "KV cache: sequence ", seq, " would hold ", s.length + n,
           " tokens, more than max_tokens = ", options_.max_tokens);
    const int64_t first = s.length;
    s.length += n;
    const size_t need = static_cast<size_t>(s.length * config_.kv_dim());
    for (auto& layer : s.k) layer.resize(need);
    for (auto& layer : s.v) layer.resize(need);
    return first;
  }
  int64_t length(int seq) const override { return get(seq).length; }

  void write(int layer, int seq, int64_t first_pos, int64_t n, std::span<const float> k,
             std::span<const float> v) override {
    Seq& s = get(seq);
    const int64_t d = config_.kv_dim();
    LOWBIT_CHECK_ARG(first_pos >= 0 && first_pos + n <= s.length, "first_pos", first_pos, "inside the sequence");
    LOWBIT_CHECK_ARG(k.size() == static_cast<size_t>(n * d) && v.size() == k.size(), "k/v size", k.size(),
                     "n * kv_dim floats");
    T* kd = s.k[static_cast<size_t>(layer)].data() + first_pos * d;
    T* vd = s.v[static_cast<size_t>(layer)].data() + first_pos * d;
    for (size_t i = 0; i < k.size(); ++i) {
      kd[i] = store<T>(k[i]);
      vd[i] = store<T>(v[i]);
    }
  }

  void attend(int layer, int seq, int64_t first_pos, int64_t n, std::span<const float> q, std::span<float> out,
              ThreadPool* pool) const override {
    const Seq& s = get(seq);
    const int64_t H = config_.num_heads, D = config_.head_dim, KVH = config_.num_kv_heads;
    const int64_t group = H / KVH, kvd = config_.kv_dim();
    LOWBIT_CHECK_ARG(first_pos >= 0 && first_pos + n <= s.length, "first_pos", first_pos, "inside the sequence");
    const T* K = s.k[static_cast<size_t>(layer)].data();
    const T* V = s.v[static_cast<size_t>(layer)].data();
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    const auto body = [&](int64_t begin, int64_t end) {
      std::vector<float> scores(static_cast<size_t>(first_pos + n));
      std::vector<float> acc(static_cast<size_t>(D));
      for (int64_t item = begin; item < end; ++item) {
        const int64_t i = item / H, h = item % H, kh = h / group;
        const int64_t pos = first_pos + i;
        const float* qv = q.data() + (i * H + h) * D;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t <= pos; ++t) {
          const float score = cpu::dot(qv, K + t * kvd + kh * D, D) * scale;
          scores[static_cast<size_t>(t)] = score;
          mx = std::max(mx, score);
        }
        float sum = 0.0f;
        for (int64_t t = 0; t <= pos; ++t) {
          const float e = std::exp(scores[static_cast<size_t>(t)] - mx);
          scores[static_cast<size_t>(t)] = e;
          sum += e;
        }
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t t = 0; t <= pos; ++t) {
          cpu::axpy(scores[static_cast<size_t>(t)], V + t * kvd + kh * D, acc.data(), D);
        }
        float* o = out.data() + (i * H + h) * D;
        for (int64_t j = 0; j < D; ++j) o[j] = acc[static_cast<size_t>(j)] / sum;
      }
    };
    if (pool != nullptr) pool->run(0, n * H, 1, body);
    else body(0, n * H);
  }

  int64_t bytes_per_token() const override {
    return 2 * config_.num_layers * config_.kv_dim() * static_cast<int64_t>(sizeof(T));
  }
  int64_t bytes_used() const override {
    int64_t tokens = 0;
    for (const Seq& s : seqs_) tokens += s.active ? s.length : 0;
    return tokens * bytes_per_token();
  }
  std::string describe() const override { return options_.describe() + " (dense)"; }

 private:
  struct Seq {
    bool active = false;
    int64_t length = 0;
    std::vector<std::vector<T>> k, v;  // [layer][token * kv_dim]
  };
  Seq make_seq() const {
    Seq s;
    s.active = true;
    s.k.resize(static_cast<size_t>(config_.num_layers));
    s.v.resize(static_cast<size_t>(config_.num_layers));
    return s;
  }
  Seq& get(int seq) {
    if (seq < 0 || static_cast<size_t>(seq) >= seqs_.size() || !seqs_[static_cast<size_t>(seq)].active)
      fail_argument("seq", seq, "an active sequence id");
    return seqs_[static_cast<size_t>(seq)];
  }
  const Seq& get(int seq) const { return const_cast<DenseKvStore*>(this)->get(seq); }

  ModelConfig config_;
  KvOptions options_;
  std::vector<Seq> seqs_;
};

// ---- paged TurboQuant (kv module) --------------------------------------------------------

kv::KvFormat to_kv_format(KvStorage s) {
  switch (s) {
    case KvStorage::fp16: return kv::KvFormat::fp16;
    case KvStorage::tq4: return kv::KvFormat::tq4;
    case KvStorage::tq3: return kv::KvFormat::tq3;
    case KvStorage::tq2: return kv::KvFormat::tq2;
    case KvStorage::fp32: break;
  }
  fail(ErrorKind::internal, "fp32 has no paged KV format");
}

class PagedKvStore final : public KvStore {
 public:
  PagedKvStore(const ModelConfig& c, const KvOptions& o) : config_(c), options_(o), cache_(make_config(c, o)) {}

  int add_sequence() override {
    if (active_ >= options_.max_sequences)
      fail(ErrorKind::invalid_argument, "KV cache: all ", options_.max_sequences, " sequences are in use");
    const int seq = cache_.add_sequence();
    ++active_;
    if (options_.fp16_window > 0) {
      if (static_cast<size_t>(seq) >= windows_.size()) windows_.resize(static_cast<size_t>(seq) + 1);
      windows_[static_cast<size_t>(seq)].assign(static_cast<size_t>(config_.num_layers), Fp16Window{});
    }
    return seq;
  }
  void release_sequence(int seq) override {
    cache_.release_sequence(seq);
    --active_;
    if (static_cast<size_t>(seq) < windows_.size()) windows_[static_cast<size_t>(seq)].clear();
  }
  int64_t extend(int seq, int64_t n) override {
    if (cache_.length(seq) + n > options_.max_tokens)
      fail(ErrorKind::invalid_argument, "KV cache: sequence ", seq, " would hold ", cache_.length(seq) + n,
           " tokens, more than max_tokens = ", options_.max_tokens);
    return cache_.extend(seq, n);
  }
  int64_t length(int seq) const override { return cache_.length(seq); }
  void write(int layer, int seq, int64_t first_pos, int64_t n, std::span<const float> k,
             std::span<const float> v) override {
    cache_.write(layer, seq, first_pos, n, k, v);
    if (options_.fp16_window == 0) return;
    // The copies the queries of this block and later ones can need: from
    // first_pos - W + 1 (the first query's window) to the block's end. The
    // rows before that are dropped (a decode step drops one); the block is
    // appended, or rewrites rows it overlaps.
    const int64_t W = options_.fp16_window, d = config_.kv_dim();
    Fp16Window& w = windows_[static_cast<size_t>(seq)][static_cast<size_t>(layer)];
    const int64_t keep_from = std::max<int64_t>(0, first_pos - W + 1);
    if (keep_from < w.first || first_pos > w.end(d))
      fail(ErrorKind::invalid_argument, "KV cache: sequence ", seq, " layer ", layer, " writes positions ", first_pos,
           "..", first_pos + n - 1, " but its fp16 window holds ", w.first, "..", w.end(d) - 1,
           ": with a window, positions are written in order");
    w.drop_before(keep_from, d);
    const auto rows = static_cast<size_t>((std::max(first_pos + n, w.end(d)) - keep_from) * d);
    w.k.resize(rows);
    w.v.resize(rows);
    const auto at = static_cast<size_t>((first_pos - keep_from) * d);
    for (size_t j = 0; j < static_cast<size_t>(n * d); ++j) {
      w.k[at + j] = float_to_f16(k[j]);
      w.v[at + j] = float_to_f16(v[j]);
    }
  }
  void attend(int layer, int seq, int64_t first_pos, int64_t n, std::span<const float> q, std::span<float> out,
              ThreadPool* pool) const override {
    if (options_.reference_attention) {
      kv::paged_prefill_attention_ref(cache_, layer, seq, first_pos, n, static_cast<int>(config_.num_heads), q, out);
      return;
    }
    cache_.check_layer(layer);
    const int64_t H = config_.num_heads, D = config_.head_dim, KVH = config_.num_kv_heads, G = H / KVH;
    const int64_t P = options_.page_size;
    LOWBIT_CHECK_ARG(first_pos >= 0 && first_pos + n <= cache_.length(seq), "first_pos", first_pos,
                     "inside the sequence");
    LOWBIT_CHECK_ARG(q.size() == static_cast<size_t>(n * H * D) && out.size() == q.size(), "q/out size", q.size(),
                     "n * num_heads * head_dim floats");
    const std::span<const int32_t> table = cache_.block_table(seq);
    const bool k_rot = cache_.stored_rotated(kv::KvPart::key), v_rot = cache_.stored_rotated(kv::KvPart::value);
    const kv::Rotation& rot = cache_.rotation(layer);
    const float softmax_scale = 1.0f / std::sqrt(static_cast<float>(D));
    // The query at position pos reads keys and values pos - W + 1 .. pos from
    // the fp16 window, in the original domain: they are scored against the
    // unrotated query and summed apart, then added to the codes' sum once
    // that is un-rotated.
    const int64_t W = options_.fp16_window;
    const Fp16Window* window = W > 0 ? &windows_[static_cast<size_t>(seq)][static_cast<size_t>(layer)] : nullptr;
    if (window != nullptr && (std::max<int64_t>(0, first_pos - W + 1) < window->first ||
                              first_pos + n > window->end(config_.kv_dim())))
      fail(ErrorKind::invalid_argument, "KV cache: sequence ", seq, " layer ", layer, " attends positions ", first_pos,
           "..", first_pos + n - 1, " but its fp16 window holds ", window->first, "..",
           window->end(config_.kv_dim()) - 1, ": attend the tokens last written");
    // One item = one query token and one KV head with its G query heads.
    const auto body = [&](int64_t begin, int64_t end) {
      const auto dsz = static_cast<size_t>(D);
      std::vector<float> qr(static_cast<size_t>(G) * dsz), unit(dsz), acc(static_cast<size_t>(G) * dsz);
      std::vector<float> acc_window(W > 0 ? static_cast<size_t>(G) * dsz : 0);
      std::vector<float> scores(static_cast<size_t>(G * (first_pos + n)));
      // Position t of the window's K or V for this KV head, as floats.
      const auto window_row = [&](const std::vector<f16>& rows, int64_t t, int64_t kh) {
        const f16* src = rows.data() + (t - window->first) * config_.kv_dim() + kh * D;
        for (int64_t j = 0; j < D; ++j) unit[static_cast<size_t>(j)] = f16_to_float(src[j]);
      };
      for (int64_t item = begin; item < end; ++item) {
        const int64_t i = item / KVH, kh = item % KVH, pos = first_pos + i, T = pos + 1;
        const int64_t T_codes = W > 0 ? std::max<int64_t>(0, T - W) : T;  // positions read from codes
        const float* q_heads = q.data() + ((i * H) + kh * G) * D;     // the G query heads, unrotated
        for (int64_t g = 0; g < G; ++g) {
          const std::span<const float> qh(q_heads + g * D, dsz);
          const std::span<float> dst(qr.data() + g * D, dsz);
          if (k_rot) rot.rotate(qh, dst);  // keys are scored in the rotated domain
          else std::copy(qh.begin(), qh.end(), dst.begin());
        }
        std::vector<float> mx(static_cast<size_t>(G), -std::numeric_limits<float>::infinity());
        for (int64_t t = 0; t < T; ++t) {
          float s = softmax_scale;
          const float* query = qr.data();
          if (t < T_codes) {
            const std::byte* slab = cache_.slab(layer, table[static_cast<size_t>(t / P)], static_cast<int>(kh));
            s *= cache_.decode_slot(kv::KvPart::key, slab, static_cast<int>(t % P), unit);
          } else {
            window_row(window->k, t, kh);
            query = q_heads;
          }
          for (int64_t g = 0; g < G; ++g) {
            const float score = s * cpu::dot(query + g * D, unit.data(), D);
            scores[static_cast<size_t>(g * T + t)] = score;
            mx[static_cast<size_t>(g)] = std::max(mx[static_cast<size_t>(g)], score);
          }
        }
        std::vector<float> sum(static_cast<size_t>(G), 0.0f);
        for (int64_t g = 0; g < G; ++g)
          for (int64_t t = 0; t < T; ++t) {
            float& e = scores[static_cast<size_t>(g * T + t)];
            e = std::exp(e - mx[static_cast<size_t>(g)]);
            sum[static_cast<size_t>(g)] += e;
          }
        std::fill(acc.begin(), acc.end(), 0.0f);
        std::fill(acc_window.begin(), acc_window.end(), 0.0f);
        for (int64_t t = 0; t < T; ++t) {
          float s = 1.0f;
          float* into = acc.data();
          if (t < T_codes) {
            const std::byte* slab = cache_.slab(layer, table[static_cast<size_t>(t / P)], static_cast<int>(kh));
            s = cache_.decode_slot(kv::KvPart::value, slab, static_cast<int>(t % P), unit);
          } else {
            window_row(window->v, t, kh);
            into = acc_window.data();
          }
          for (int64_t g = 0; g < G; ++g)
            cpu::axpy(s * scores[static_cast<size_t>(g * T + t)], unit.data(), into + g * D, D);
        }
        for (int64_t g = 0; g < G; ++g) {
          float* o = out.data() + ((i * H) + kh * G + g) * D;
          const float inv = 1.0f / sum[static_cast<size_t>(g)];
          for (int64_t j = 0; j < D; ++j) o[j] = acc[static_cast<size_t>(g * D + j)] * inv;
          if (v_rot) rot.unrotate(std::span<const float>(o, dsz), std::span<float>(o, dsz));  // once, after the sum
          if (T_codes < T)
            for (int64_t j = 0; j < D; ++j) o[j] += acc_window[static_cast<size_t>(g * D + j)] * inv;
        }
      }
    };
    if (pool != nullptr) pool->run(0, n * KVH, 1, body);
    else body(0, n * KVH);
    // Later queries (positions first_pos + n on) need no row before
    // first_pos + n - W + 1: a prompt block's copies shrink to the window
    // here, layer by layer, instead of all layers holding the whole block
    // until their next write.
    if (W > 0) windows_[static_cast<size_t>(seq)][static_cast<size_t>(layer)].drop_before(
        std::max<int64_t>(0, first_pos + n - W + 1), config_.kv_dim());
  }
  int64_t bytes_per_token() const override { return cache_.bytes_per_token(); }
  int64_t bytes_used() const override {
    // Whole pages are taken per sequence; and the fp16 window's copies.
    int64_t window_bytes = 0;
    for (const auto& layers : windows_)
      for (const Fp16Window& w : layers) window_bytes += static_cast<int64_t>((w.k.size() + w.v.size()) * sizeof(f16));
    return cache_.used_pages() * cache_.page_bytes() + window_bytes;
  }
  std::string describe() const override {
    std::ostringstream s;
    s << options_.describe() << " (paged, " << options_.page_size << " tokens per page, "
      << kv::rotation_kind_name(kv_rotation_for(options_.rotation, config_.head_dim)) << " rotation seed "
      << options_.rotation_seed << " + 1000 * layer)";
    return s.str();
  }

 private:
  static kv::KvCacheConfig make_config(const ModelConfig& c, const KvOptions& o) {
    kv::KvCacheConfig k;
    k.num_layers = static_cast<int>(c.num_layers);
    k.num_kv_heads = static_cast<int>(c.num_kv_heads);
    k.head_dim = static_cast<int>(c.head_dim);
    k.page_size = o.page_size;
    const int64_t pages_per_seq = (o.max_tokens + o.page_size - 1) / o.page_size;
    k.num_pages = pages_per_seq * o.max_sequences;
    k.k_format = to_kv_format(o.k);
    k.v_format = to_kv_format(o.v);
    k.rotation_seed_base = o.rotation_seed;
    k.rotation = kv_rotation_for(o.rotation, c.head_dim);
    k.validate();
    return k;
  }

  ModelConfig config_;
  KvOptions options_;
  kv::PagedKvCache cache_;
  int active_ = 0;
  // KvOptions::fp16_window: per sequence and layer, K and V as fp16 of the
  // positions first.. that the next queries can read from the window:
  // [position - first][kv_head][head_dim]. W - 1 rows between calls, W - 1
  // + n while a block of n is written and attended.
  struct Fp16Window {
    int64_t first = 0;
    std::vector<f16> k, v;
    int64_t end(int64_t kv_dim) const { return first + static_cast<int64_t>(k.size()) / kv_dim; }
    void drop_before(int64_t pos, int64_t kv_dim) {
      const auto rows = static_cast<std::ptrdiff_t>(std::clamp(pos, first, end(kv_dim)) - first) * kv_dim;
      k.erase(k.begin(), k.begin() + rows);
      v.erase(v.begin(), v.begin() + rows);
      first = std::max(first, pos);
    }
  };
  // mutable: attend() trims what its queries were the last to need.
  mutable std::vector<std::vector<Fp16Window>> windows_;  // [seq][layer]
};

}  // namespace

kv::RotationKind kv_rotation_for(std::optional<kv::RotationKind> chosen, int64_t head_dim) {
  if (chosen) return *chosen;
  return head_dim >= 1 && head_dim <= 1024 && std::has_single_bit(static_cast<uint64_t>(head_dim))
             ? kv::RotationKind::hadamard
             : kv::RotationKind::haar;
}

std::unique_ptr<KvStore> make_kv_store(const ModelConfig& config, const KvOptions& options) {
  options.validate();
  if (options.k == KvStorage::fp32) return std::make_unique<DenseKvStore<float>>(config, options);
  if (options.k == KvStorage::fp16 && options.v == KvStorage::fp16)
    return std::make_unique<DenseKvStore<f16>>(config, options);
  return std::make_unique<PagedKvStore>(config, options);
}

}  // namespace lowbit::engine
