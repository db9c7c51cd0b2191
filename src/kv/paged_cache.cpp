#include "lowbit/kv/paged_cache.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "lowbit/core/error.h"
#include "lowbit/core/half.h"
#include "lowbit/core/host_memory.h"
#include "lowbit/core/parallel.h"
#include "span_checks.h"

namespace lowbit::kv {

void KvCacheConfig::validate() const {
  LOWBIT_CHECK_ARG(num_layers >= 1 && num_layers <= 4096, "num_layers", num_layers, "1 to 4096");
  LOWBIT_CHECK_ARG(num_kv_heads >= 1 && num_kv_heads <= 1024, "num_kv_heads", num_kv_heads, "1 to 1024");
  check_kv_head_dim(head_dim, rotation, "head_dim");
  LOWBIT_CHECK_ARG(
      page_size >= kMinPageSize && page_size <= kMaxPageSize && page_size % kPageSizeMultiple == 0,
      "page_size", page_size, "a multiple of 16 in [16, 256] (whole 16-byte vectors per page section)");
  LOWBIT_CHECK_ARG(num_pages >= 1 && num_pages <= std::numeric_limits<int32_t>::max(), "num_pages", num_pages,
                   "1 to 2^31 - 1 (block tables hold int32 page numbers)");
}

namespace {

PageLayout make_layout(const KvCacheConfig& c) {
  PageLayout l;
  const int64_t P = c.page_size;
  l.k_row_bytes = is_quantized(c.k_format)
                      ? static_cast<int64_t>(packed_index_bytes(kv_format_bits(c.k_format), c.head_dim))
                      : 2 * static_cast<int64_t>(c.head_dim);
  l.v_row_bytes = is_quantized(c.v_format)
                      ? static_cast<int64_t>(packed_index_bytes(kv_format_bits(c.v_format), c.head_dim))
                      : 2 * static_cast<int64_t>(c.head_dim);
  l.k_scale_bytes = is_quantized(c.k_format) ? static_cast<int64_t>(scale_dtype_bytes(c.scale_dtype)) : 0;
  l.v_scale_bytes = is_quantized(c.v_format) ? static_cast<int64_t>(scale_dtype_bytes(c.scale_dtype)) : 0;
  l.k_rows = 0;
  l.k_scales = l.k_rows + P * l.k_row_bytes;
  l.v_rows = l.k_scales + P * l.k_scale_bytes;
  l.v_scales = l.v_rows + P * l.v_row_bytes;
  l.bytes = l.v_scales + P * l.v_scale_bytes;
  if (l.k_scales % 16 != 0 || l.v_rows % 16 != 0 || l.v_scales % 16 != 0 || l.bytes % 16 != 0)
    fail(ErrorKind::internal, "page sections are not 16-byte aligned for page_size ", P, ", head_dim ",
         c.head_dim);
  return l;
}

}  // namespace

PagedKvCache::PagedKvCache(const KvCacheConfig& config) : config_(config) {
  config_.validate();
  layout_ = make_layout(config_);
  const QuantizerOptions options{config_.scale_dtype, config_.renormalize, config_.codebook};
  if (is_quantized(config_.k_format))
    k_quantizer_ =
        std::make_unique<VectorQuantizer>(kv_format_bits(config_.k_format), config_.head_dim, options);
  if (is_quantized(config_.v_format))
    v_quantizer_ =
        std::make_unique<VectorQuantizer>(kv_format_bits(config_.v_format), config_.head_dim, options);
  rotations_.reserve(static_cast<size_t>(config_.num_layers));
  for (int l = 0; l < config_.num_layers; ++l)
    rotations_.push_back(Rotation::make(config_.rotation, config_.head_dim,
                                        layer_rotation_seed(config_.rotation_seed_base, l)));
  const int64_t pool = config_.num_pages * config_.num_kv_heads * layout_.bytes;
  // Refused here rather than killed by the OOM killer once the pools below
  // are cleared: every page is allocated up front.
  int64_t pools_bytes = 0;
  if (__builtin_mul_overflow(pool, static_cast<int64_t>(config_.num_layers), &pools_bytes))
    pools_bytes = std::numeric_limits<int64_t>::max();
  require_host_memory(pools_bytes,
                      "the paged KV cache (" + std::to_string(config_.num_layers) + " layers x " +
                          std::to_string(config_.num_pages) + " pages x " + std::to_string(config_.num_kv_heads) +
                          " KV heads x " + std::to_string(layout_.bytes) + " bytes)");
  for (int l = 0; l < config_.num_layers; ++l) {
    pools_.emplace_back(static_cast<size_t>(pool));
    std::memset(pools_.back().data(), 0, static_cast<size_t>(pool));
  }
  free_pages_.reserve(static_cast<size_t>(config_.num_pages));
  for (int64_t p = config_.num_pages; p-- > 0;) free_pages_.push_back(static_cast<int32_t>(p));
}

void PagedKvCache::check_layer(int layer) const {
  LOWBIT_CHECK_ARG(layer >= 0 && layer < config_.num_layers, "layer", layer,
                   "0 to num_layers - 1 = " + std::to_string(config_.num_layers - 1));
}

void PagedKvCache::check_sequence(int seq, std::string_view name) const {
  LOWBIT_CHECK_ARG(
      seq >= 0 && seq < static_cast<int>(sequences_.size()) && sequences_[static_cast<size_t>(seq)].active,
      name, seq, "the id of a live sequence (from add_sequence, not released)");
}

const Rotation& PagedKvCache::rotation(int layer) const {
  check_layer(layer);
  return rotations_[static_cast<size_t>(layer)];
}

const VectorQuantizer* PagedKvCache::quantizer(KvPart part) const {
  return part == KvPart::key ? k_quantizer_.get() : v_quantizer_.get();
}

int PagedKvCache::add_sequence() {
  for (size_t i = 0; i < sequences_.size(); ++i)
    if (!sequences_[i].active) {
      sequences_[i] = Sequence{true, 0, {}};
      return static_cast<int>(i);
    }
  sequences_.push_back(Sequence{true, 0, {}});
  return static_cast<int>(sequences_.size() - 1);
}

void PagedKvCache::release_sequence(int seq) {
  check_sequence(seq);
  Sequence& s = sequences_[static_cast<size_t>(seq)];
  // Back on the stack in reverse, so the sequence's first page is reused first.
  for (auto it = s.pages.rbegin(); it != s.pages.rend(); ++it) free_pages_.push_back(*it);
  s = Sequence{};
}

int64_t PagedKvCache::extend(int seq, int64_t n_tokens) {
  check_sequence(seq);
  LOWBIT_CHECK_ARG(n_tokens >= 1, "n_tokens", n_tokens, "at least 1");
  Sequence& s = sequences_[static_cast<size_t>(seq)];
  const int64_t P = config_.page_size;
  const int64_t needed = (s.length + n_tokens + P - 1) / P - static_cast<int64_t>(s.pages.size());
  if (needed > free_pages())
    fail(ErrorKind::invalid_argument, "invalid argument 'n_tokens' = ", n_tokens, ": sequence ", seq,
         " (length ", s.length, ") needs ", needed, " more pages of ", P, " tokens but only ", free_pages(),
         " of ", config_.num_pages, " are free; expected at most ",
         static_cast<int64_t>(s.pages.size() + free_pages_.size()) * P - s.length,
         " tokens (or a cache with more num_pages)");
  for (int64_t i = 0; i < needed; ++i) {
    s.pages.push_back(free_pages_.back());
    free_pages_.pop_back();
  }
  const int64_t first = s.length;
  s.length += n_tokens;
  return first;
}

int64_t PagedKvCache::length(int seq) const {
  check_sequence(seq);
  return sequences_[static_cast<size_t>(seq)].length;
}

std::span<const int32_t> PagedKvCache::block_table(int seq) const {
  check_sequence(seq);
  return sequences_[static_cast<size_t>(seq)].pages;
}

const std::byte* PagedKvCache::slab(int layer, int32_t page, int kv_head) const {
  check_layer(layer);
  LOWBIT_CHECK_ARG(page >= 0 && page < config_.num_pages, "page", page,
                   "0 to num_pages - 1 = " + std::to_string(config_.num_pages - 1));
  LOWBIT_CHECK_ARG(kv_head >= 0 && kv_head < config_.num_kv_heads, "kv_head", kv_head,
                   "0 to num_kv_heads - 1 = " + std::to_string(config_.num_kv_heads - 1));
  const int64_t index = static_cast<int64_t>(page) * config_.num_kv_heads + kv_head;
  return pools_[static_cast<size_t>(layer)].as<const std::byte>() + index * layout_.bytes;
}

std::byte* PagedKvCache::mutable_slab(int layer, int32_t page, int kv_head) {
  return const_cast<std::byte*>(slab(layer, page, kv_head));
}

std::span<const std::byte> PagedKvCache::layer_pool(int layer) const {
  check_layer(layer);
  const Buffer& b = pools_[static_cast<size_t>(layer)];
  return {b.as<const std::byte>(), b.size()};
}

void PagedKvCache::write(int layer, int seq, int64_t first_pos, int64_t n_tokens, std::span<const float> k,
                         std::span<const float> v) {
  check_layer(layer);
  check_sequence(seq);
  const Sequence& s = sequences_[static_cast<size_t>(seq)];
  LOWBIT_CHECK_ARG(n_tokens >= 1, "n_tokens", n_tokens, "at least 1");
  LOWBIT_CHECK_ARG(first_pos >= 0 && first_pos + n_tokens <= s.length, "first_pos", first_pos,
                   "positions first_pos .. first_pos + n_tokens - 1 (n_tokens = " + std::to_string(n_tokens) +
                       ") inside sequence " + std::to_string(seq) + " of length " + std::to_string(s.length) +
                       " (call extend() first)");
  const int H = config_.num_kv_heads, d = config_.head_dim;
  const size_t expected = static_cast<size_t>(n_tokens) * static_cast<size_t>(H) * static_cast<size_t>(d);
  const std::string shape = "[n_tokens " + std::to_string(n_tokens) + "][num_kv_heads " + std::to_string(H) +
                            "][head_dim " + std::to_string(d) + "]";
  detail::check_span_size("k", k.size(), expected, shape);
  detail::check_span_size("v", v.size(), expected, shape);

  const Rotation& rot = rotations_[static_cast<size_t>(layer)];
  const int64_t P = config_.page_size;
  auto store = [&](KvPart part, const float* x, std::byte* slab_ptr, int64_t slot) {
    const bool is_key = part == KvPart::key;
    std::byte* row = slab_ptr + (is_key ? layout_.k_rows : layout_.v_rows) +
                     slot * (is_key ? layout_.k_row_bytes : layout_.v_row_bytes);
    const VectorQuantizer* q = quantizer(part);
    if (q == nullptr) {
      for (int j = 0; j < d; ++j) {
        const f16 h = float_to_f16(x[j]);
        std::memcpy(row + 2 * j, &h.bits, 2);
      }
      return;
    }
    const int64_t scale_bytes = is_key ? layout_.k_scale_bytes : layout_.v_scale_bytes;
    std::byte* scale = slab_ptr + (is_key ? layout_.k_scales : layout_.v_scales) + slot * scale_bytes;
    q->quantize(rot, std::span<const float>(x, static_cast<size_t>(d)),
                std::span<uint8_t>(reinterpret_cast<uint8_t*>(row), q->code_bytes()),
                std::span<std::byte>(scale, static_cast<size_t>(scale_bytes)));
  };
  // One item = one (token, head) pair: K and V of it.
  parallel_for(0, n_tokens * H, 64, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / H;
      const int h = static_cast<int>(item % H);
      const int64_t pos = first_pos + t;
      std::byte* slab_ptr = mutable_slab(layer, s.pages[static_cast<size_t>(pos / P)], h);
      const size_t offset = static_cast<size_t>(item) * static_cast<size_t>(d);
      store(KvPart::key, k.data() + offset, slab_ptr, pos % P);
      store(KvPart::value, v.data() + offset, slab_ptr, pos % P);
    }
  });
}

float PagedKvCache::decode_slot(KvPart part, const std::byte* slab_ptr, int slot,
                                std::span<float> unit) const {
  const int d = config_.head_dim;
  if (unit.size() != static_cast<size_t>(d))
    detail::check_span_size("unit", unit.size(), static_cast<size_t>(d),
                            "[head_dim " + std::to_string(d) + "]");
  LOWBIT_CHECK_ARG(slot >= 0 && slot < config_.page_size, "slot", slot,
                   "0 to page_size - 1 = " + std::to_string(config_.page_size - 1));
  const bool is_key = part == KvPart::key;
  const int64_t row_bytes = is_key ? layout_.k_row_bytes : layout_.v_row_bytes;
  const std::byte* row = slab_ptr + (is_key ? layout_.k_rows : layout_.v_rows) + slot * row_bytes;
  const VectorQuantizer* q = quantizer(part);
  if (q == nullptr) {
    for (int j = 0; j < d; ++j) {
      f16 h;
      std::memcpy(&h.bits, row + 2 * j, 2);
      unit[static_cast<size_t>(j)] = f16_to_float(h);
    }
    return 1.0f;
  }
  uint8_t indices[kMaxKvDim];
  unpack_indices(
      q->bits(),
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(row), static_cast<size_t>(row_bytes)),
      std::span<uint8_t>(indices, static_cast<size_t>(d)));
  const std::vector<float>& c = q->codebook().centroids_f32;
  for (int j = 0; j < d; ++j) unit[static_cast<size_t>(j)] = c[indices[j]];
  const int64_t scale_bytes = is_key ? layout_.k_scale_bytes : layout_.v_scale_bytes;
  const std::byte* scale = slab_ptr + (is_key ? layout_.k_scales : layout_.v_scales) + slot * scale_bytes;
  return q->load_scale(std::span<const std::byte>(scale, static_cast<size_t>(scale_bytes)));
}

void PagedKvCache::read_stored(KvPart part, int layer, int seq, int64_t pos, int kv_head,
                               std::span<float> out) const {
  check_sequence(seq);
  const Sequence& s = sequences_[static_cast<size_t>(seq)];
  LOWBIT_CHECK_ARG(
      pos >= 0 && pos < s.length, "pos", pos,
      "0 to length - 1 = " + std::to_string(s.length - 1) + " of sequence " + std::to_string(seq));
  const int64_t P = config_.page_size;
  const float scale = decode_slot(part, slab(layer, s.pages[static_cast<size_t>(pos / P)], kv_head),
                                  static_cast<int>(pos % P), out);
  for (float& x : out) x *= scale;
}

void PagedKvCache::read_original(KvPart part, int layer, int seq, int64_t pos, int kv_head,
                                 std::span<float> out) const {
  read_stored(part, layer, seq, pos, kv_head, out);
  if (stored_rotated(part)) rotations_[static_cast<size_t>(layer)].unrotate(out, out);
}

int64_t PagedKvCache::bytes_per_token_per_layer() const {
  const int64_t k =
      static_cast<int64_t>(kv_vector_bytes(config_.k_format, config_.head_dim, config_.scale_dtype));
  const int64_t v =
      static_cast<int64_t>(kv_vector_bytes(config_.v_format, config_.head_dim, config_.scale_dtype));
  return config_.num_kv_heads * (k + v);
}

int64_t PagedKvCache::bytes_per_token() const { return config_.num_layers * bytes_per_token_per_layer(); }

int64_t PagedKvCache::page_bytes() const { return config_.num_layers * config_.num_kv_heads * layout_.bytes; }

int64_t PagedKvCache::pool_bytes() const { return config_.num_pages * page_bytes(); }

}  // namespace lowbit::kv
