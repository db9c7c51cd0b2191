// The ans chain on the GPU against the CPU reference: every container, its
// kernel (seed-faithful MATVANS, int8 GEMV, fused lowbit), random chains with
// odd shapes (rows of length 1, widths that are not multiples of 4, 16 or
// 128), a single-symbol distribution, all 256 symbols, every states-per-lane
// count, both lookup-table layouts (P <= 12 packed, P > 12 two-level), with
// and without weight copies; corrupt payloads must fail, not answer.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ans/ans_test_util.h"
#include "gpu_test_util.h"
#include "lowbit/ans/ans_cuda.h"
#include "lowbit/ans/ans_file.h"
#include "lowbit/ans/synthetic.h"
#include "lowbit/core/error.h"

namespace lowbit {
namespace {

using namespace lowbit::ans;
using test::ans::Dist;
using test::ans::dist_name;
using test::ans::random_chain;

struct Case {
  Container container;
  LowbitOptions lowbit;
  std::string label;
};

std::vector<Case> all_containers() {
  std::vector<Case> cases;
  cases.push_back({Container::seed, {}, "seed"});
  cases.push_back({Container::seed_nohash, {}, "seed-nohash"});
  cases.push_back({Container::baseline, {}, "baseline"});
  cases.push_back({Container::baseline_rowmajor, {}, "baseline-rowmajor"});
  for (int k : {1, 2, 4, 8})
    for (int64_t R : {int64_t{0}, int64_t{1}, int64_t{3}}) {
      LowbitOptions o;
      o.states_per_lane = k;
      o.rows_per_tile = R;
      cases.push_back({Container::lowbit, o, "lowbit k=" + std::to_string(k) + " R=" + std::to_string(R)});
    }
  for (int P : {8, 11, 13, 15}) {  // packed table up to 12 bits, the two-level table above
    LowbitOptions o;
    o.precision = P;
    o.rows_per_tile = 2;
    cases.push_back({Container::lowbit, o, "lowbit P=" + std::to_string(P)});
  }
  return cases;
}

AnsFile encode(const Chain& chain, const Case& c) {
  EncodeOptions eo;
  eo.container = c.container;
  eo.lowbit = c.lowbit;
  // Round-trip through the bytes, so the GPU reads what a file holds.
  const AnsFile f = encode_ans_file(chain, eo);
  ReadOptions ro;
  ro.container = c.container;
  ro.baseline_order = c.container == Container::baseline_rowmajor ? BaselineOrder::row_major : BaselineOrder::column_major;
  return parse_ans_file(serialize_ans_file(f), c.label, ro);
}

void expect_same_as_cpu(const AnsFile& file, const std::string& what, bool with_copies = false) {
  const ChainRun cpu = run_chain_cpu(file, what);
  CudaRunOptions o;
  o.with_copies = with_copies;
  const ChainRun gpu = run_chain_cuda(file, what, o);
  EXPECT_EQ(gpu.final_vector, cpu.final_vector) << what;
  EXPECT_EQ(gpu.hash, cpu.hash) << what;
  EXPECT_EQ(gpu.recorded_hash, cpu.recorded_hash) << what;
  EXPECT_EQ(gpu.matrix_seconds.size(), cpu.matrix_seconds.size()) << what;
  EXPECT_GT(gpu.total_seconds, 0.0) << what;
}

TEST(AnsCuda, EveryContainerMatchesTheCpuOnRandomChains) {
  LOWBIT_REQUIRE_GPU();
  // Widths: 1 (rows of length 1 in the next matrix), 5 (a partial quad),
  // 129, 200, 300 (partial blocks of 128, 256 columns).
  const std::vector<std::vector<int64_t>> shapes = {{37, 1, 64, 129}, {200, 300, 5, 96}, {4, 4, 4}};
  for (const Case& c : all_containers())
    for (Dist d : {Dist::gaussian, Dist::peaked, Dist::uniform_127, Dist::two_values, Dist::sparse_grid})
      for (size_t s = 0; s < shapes.size(); ++s) {
        const Chain chain = random_chain(shapes[s], d, 1000u + static_cast<uint32_t>(s));
        expect_same_as_cpu(encode(chain, c), c.label + " / " + dist_name(d) + " / shape " + std::to_string(s));
      }
}

TEST(AnsCuda, SingleSymbolAndAll256Symbols) {
  LOWBIT_REQUIRE_GPU();
  for (const Case& c : all_containers()) {
    const Chain single = random_chain({64, 70, 33}, Dist::single, 7);
    expect_same_as_cpu(encode(single, c), c.label + " / single symbol");
    if (c.container == Container::seed || c.container == Container::seed_nohash) continue;  // |G| is a u8 there
    if (c.container == Container::lowbit && c.lowbit.precision < 8) continue;
    const Chain all = random_chain({300, 260, 131}, Dist::uniform_all, 8);
    expect_same_as_cpu(encode(all, c), c.label + " / all 256 symbols");
  }
}

TEST(AnsCuda, WithCopiesGivesTheSameChain) {
  LOWBIT_REQUIRE_GPU();
  const Chain chain = random_chain({256, 256, 256, 256, 256}, Dist::gaussian, 11);
  for (const Case& c : all_containers()) expect_same_as_cpu(encode(chain, c), c.label + " / with copies", true);
}

TEST(AnsCuda, SyntheticWeightsAtGpuTileSizes) {
  LOWBIT_REQUIRE_GPU();
  for (int bits : {8, 4}) {
    SyntheticOptions so;
    so.layers = 3;
    so.dim = 1024;
    so.bits = bits;
    so.granularity = bits == 4 ? Granularity::per_group : Granularity::per_tensor;
    const Chain chain = make_synthetic_chain(so);
    for (int64_t R : {int64_t{1}, int64_t{0}}) {
      EncodeOptions eo;
      eo.container = Container::lowbit;
      eo.lowbit.rows_per_tile = R;
      const AnsFile f = encode_ans_file(chain, eo);
      const ChainRun gpu = run_chain_cuda(f, "synthetic");
      EXPECT_EQ(gpu.hash, *chain.result_hash) << bits << " bits, R = " << R;
    }
    EncodeOptions eo;
    eo.container = Container::seed;
    eo.drop_scales = true;
    EXPECT_EQ(run_chain_cuda(encode_ans_file(chain, eo), "seed").hash, *chain.result_hash) << bits << " bits";
    eo.container = Container::baseline;
    EXPECT_EQ(run_chain_cuda(encode_ans_file(chain, eo), "baseline").hash, *chain.result_hash) << bits << " bits";
  }
}

// Flips bytes of the payload region; whatever the CPU decoder says, the GPU
// must say too: an error (Error(format)) or, when the damage is not
// detectable, the same final vector.
TEST(AnsCuda, CorruptPayloadsFailLikeTheCpu) {
  LOWBIT_REQUIRE_GPU();
  const Chain chain = random_chain({96, 130, 64}, Dist::gaussian, 21);
  int gpu_errors = 0;
  for (Container ct : {Container::lowbit, Container::seed}) {
    EncodeOptions eo;
    eo.container = ct;
    eo.lowbit.rows_per_tile = 2;
    const std::vector<uint8_t> good = serialize_ans_file(encode_ans_file(chain, eo));
    ReadOptions ro;
    ro.container = ct;
    ro.verify_checksums = false;
    for (int trial = 0; trial < 40; ++trial) {
      std::vector<uint8_t> bad = good;
      const size_t at = good.size() / 2 + static_cast<size_t>(trial) * 97 % (good.size() / 2 - 16);
      bad[at] ^= static_cast<uint8_t>(1u << (trial % 8));
      AnsFile f;
      try {
        f = parse_ans_file(bad, "corrupt", ro);
      } catch (const Error&) {
        continue;  // caught by the reader: nothing for the kernels to see
      }
      bool cpu_failed = false;
      ChainRun cpu;
      try {
        cpu = run_chain_cpu(f, "corrupt");
      } catch (const Error& e) {
        cpu_failed = e.kind() == ErrorKind::format;
      }
      try {
        const ChainRun gpu = run_chain_cuda(f, "corrupt");
        EXPECT_FALSE(cpu_failed) << container_name(ct) << " trial " << trial << ": the CPU refused, the GPU answered";
        if (!cpu_failed) EXPECT_EQ(gpu.final_vector, cpu.final_vector) << container_name(ct) << " trial " << trial;
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::format) << e.what();
        EXPECT_TRUE(cpu_failed) << container_name(ct) << " trial " << trial << ": the GPU refused, the CPU answered";
        ++gpu_errors;
      }
    }
  }
  EXPECT_GT(gpu_errors, 0) << "no corruption reached the kernels' checks";
}

TEST(AnsCuda, BenchmarkRunsOnTinySizes) {
  LOWBIT_REQUIRE_GPU();
  test::ans::TempDir tmp;
  AnsBenchOptions o;
  o.figure2_sizes = {64, 200};
  o.target_sizes = {256};
  o.layers = 3;
  o.reps = 2;
  o.copy_reps = 1;
  o.json_path = (tmp / "rows.jsonl").string();
  run_ans_benchmark(o);  // checks every method against the CPU reference before timing it
  const std::vector<uint8_t> rows = test::ans::read_bytes(o.json_path);
  const std::string text(rows.begin(), rows.end());
  for (const char* what : {"ans_figure2", "ans_product", "ans_chain_4bit", "lowbit_fused", "matvans_seed",
                           "lowbit_int8_gemv", "cublas_sgemv_fp32"})
    EXPECT_NE(text.find(what), std::string::npos) << what;
}

}  // namespace
}  // namespace lowbit
