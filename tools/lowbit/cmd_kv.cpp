// `lowbit kv`: TurboQuant KV cache tools: the Lloyd-Max codebooks and a
// round-trip quality check of the vector quantizer on random vectors.
//
//   lowbit kv codebook --bits B --dim D [--sphere] [--json]
//   lowbit kv roundtrip --bits B --dim D --n N --seed S [--rotation haar|hadamard]
//                       [--scale f16|f32] [--no-renorm] [--sphere] [--json]
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "commands.h"
#include "lowbit/kv/codebook.h"
#include "lowbit/kv/round_trip.h"

namespace lowbit::cli {
namespace {

using namespace lowbit::kv;

// Usage errors (exit 2) for head dimensions the quantizer cannot store.
CLI::Validator kv_dim_validator() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        int dim = 0;
        try {
          size_t used = 0;
          dim = std::stoi(value, &used);
          if (used != value.size()) return "--dim: '" + value + "' is not an integer";
        } catch (const std::exception&) {
          return "--dim: '" + value + "' is not an integer";
        }
        if (dim < kKvDimMultiple || dim > kMaxKvDim || dim % kKvDimMultiple != 0)
          return value + " is not a multiple of 32 in [32, 1024]";
        return {};
      },
      "multiple of 32 in [32, 1024]");
}

std::string join(const std::vector<double>& values) {
  std::ostringstream out;
  out << std::setprecision(6);
  for (size_t i = 0; i < values.size(); ++i) out << (i ? " " : "") << values[i];
  return out.str();
}

void add_codebook(CLI::App& kv) {
  auto* cmd = kv.add_subcommand(
      "codebook",
      "Print the Lloyd-Max codebook (centroids and boundaries) that quantizes the coordinates of a\n"
      "randomly rotated unit vector of dimension D: by default for N(0, 1/D), the large-D limit the\n"
      "literature tabulates; with --sphere for the exact marginal of a uniform point on the sphere.\n"
      "Solved at run time by Lloyd's iteration with closed-form integrals; boundaries are midpoints.");
  static int bits = 4;
  static int dim = 128;
  static bool sphere = false;
  static bool json = false;
  cmd->add_option("--bits", bits, "Bits per coordinate: 2^bits levels (1 to 6; the cache uses 2, 3, 4)")
      ->check(CLI::Range(kMinCodebookBits, kMaxCodebookBits))
      ->capture_default_str();
  cmd->add_option("--dim", dim, "Vector dimension D (the head dimension), 3 to 4096")
      ->check(CLI::Range(kMinCodebookDim, kMaxCodebookDim))
      ->capture_default_str();
  cmd->add_flag("--sphere", sphere,
                "Use the exact sphere marginal C (1 - y^2)^((D-3)/2) instead of N(0, 1/D)");
  cmd->add_flag("--json", json, "Print JSON instead of text");
  cmd->callback([] {
    const CoordinateDistribution distribution =
        sphere ? CoordinateDistribution::sphere : CoordinateDistribution::gaussian;
    const Codebook book = make_codebook(bits, dim, distribution);
    if (json) {
      nlohmann::json out = {{"bits", book.bits},
                            {"dim", book.dim},
                            {"distribution", coordinate_distribution_name(distribution)},
                            {"levels", book.levels()},
                            {"centroids", book.centroids},
                            {"boundaries", book.boundaries},
                            {"coordinate_mse", book.coordinate_mse},
                            {"unit_vector_mse", book.unit_vector_mse},
                            {"iterations", book.iterations}};
      std::cout << out.dump(2) << "\n";
      return;
    }
    std::cout << "Lloyd-Max codebook: " << bits << " bits (" << book.levels() << " levels), dim " << dim
              << ", coordinates ~ "
              << (sphere ? "sphere marginal C (1 - y^2)^((d-3)/2)" : "N(0, 1/" + std::to_string(dim) + ")")
              << "\ncentroids (" << book.centroids.size() << "): " << join(book.centroids) << "\nboundaries ("
              << book.boundaries.size() << "): " << join(book.boundaries) << std::setprecision(6)
              << "\nexpected MSE: " << book.coordinate_mse << " per coordinate, " << book.unit_vector_mse
              << " for a unit vector (dim * MSE)"
              << "\nsolved in " << book.iterations << " Lloyd iterations\n";
  });
}

void add_roundtrip(CLI::App& kv) {
  auto* cmd = kv.add_subcommand(
      "roundtrip",
      "Quantize N random Gaussian vectors of dimension D with the KV-cache quantizer (norm, random\n"
      "rotation, Lloyd-Max indices, scale), dequantize them and report the measured relative MSE\n"
      "E||x - x~||^2 / ||x||^2 next to the Lloyd-Max theory, the cosine of x and x~, and the error of\n"
      "inner products <y, x~> against <y, x> for random queries y (what attention scores see),\n"
      "relative to ||x|| ||y||. The same --seed gives the same numbers on any machine.");
  static int bits = 4;
  static int dim = 128;
  static int64_t n = 10000;
  static uint64_t seed = 0;
  static uint64_t rotation_seed = kDefaultRotationSeedBase;
  static std::string rotation = "haar";
  static std::string scale = "f16";
  static bool no_renorm = false;
  static bool sphere = false;
  static bool json = false;
  cmd->add_option("--bits", bits, "Bits per coordinate: 2, 3 or 4 (tq2, tq3, tq4)")
      ->check(CLI::IsMember({2, 3, 4}))
      ->capture_default_str();
  cmd->add_option("--dim", dim, "Vector dimension (head dimension): a multiple of 32 in [32, 1024]")
      ->check(kv_dim_validator())
      ->capture_default_str();
  cmd->add_option("--n", n, "Number of random vectors, 1 to 10,000,000")
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}))
      ->capture_default_str();
  cmd->add_option("--seed", seed, "Seed of the random vectors and queries")->capture_default_str();
  cmd->add_option("--rotation", rotation,
                  "haar: dense Haar-random orthogonal matrix (QR of a Gaussian matrix);\n"
                  "hadamard: random signs + fast Walsh-Hadamard transform (D a power of two)")
      ->check(CLI::IsMember({"haar", "hadamard"}))
      ->capture_default_str();
  cmd->add_option("--rotation-seed", rotation_seed, "Seed base of the rotation (layer 0 uses it as is)")
      ->capture_default_str();
  cmd->add_option("--scale", scale, "Storage type of the per-vector scale: f16 (2 bytes) or f32 (4 bytes)")
      ->check(CLI::IsMember({"f16", "f32"}))
      ->capture_default_str();
  cmd->add_flag("--no-renorm", no_renorm,
                "Store the norm itself instead of norm / ||c[idx]|| (the renormalized scale that makes the\n"
                "reconstruction's norm exact)");
  cmd->add_flag("--sphere", sphere, "Use the codebook of the exact sphere marginal instead of N(0, 1/D)");
  cmd->add_flag("--json", json, "Print JSON instead of text");
  cmd->callback([] {
    RoundTripOptions o;
    o.bits = bits;
    o.dim = dim;
    o.n = n;
    o.seed = seed;
    o.rotation = *parse_rotation_kind(rotation);
    o.rotation_seed_base = rotation_seed;
    o.quantizer.scale_dtype = *parse_scale_dtype(scale);
    o.quantizer.renormalize = !no_renorm;
    o.quantizer.distribution = sphere ? CoordinateDistribution::sphere : CoordinateDistribution::gaussian;
    const RoundTripReport r = measure_round_trip(o);
    const int64_t fp16_bytes = 2 * static_cast<int64_t>(dim);
    if (json) {
      nlohmann::json out = {{"bits", bits},
                            {"dim", dim},
                            {"n", n},
                            {"seed", seed},
                            {"rotation", rotation},
                            {"rotation_seed", rotation_seed},
                            {"scale_dtype", scale},
                            {"renormalize", !no_renorm},
                            {"codebook", sphere ? "sphere" : "gaussian"},
                            {"bytes_per_vector", r.bytes_per_vector},
                            {"code_bytes", r.code_bytes},
                            {"scale_bytes", r.scale_bytes},
                            {"fp16_bytes_per_vector", fp16_bytes},
                            {"relative_mse", r.relative_mse},
                            {"theory_mse", r.theory_mse},
                            {"cosine_mean", r.cosine_mean},
                            {"cosine_min", r.cosine_min},
                            {"inner_product_rmse", r.ip_rmse},
                            {"inner_product_bias", r.ip_bias},
                            {"inner_product_rmse_theory", r.ip_rmse_theory}};
      std::cout << out.dump(2) << "\n";
      return;
    }
    std::cout << std::setprecision(4) << "tq" << bits << " round trip: " << n
              << " random Gaussian vectors of dim " << dim << " (seed " << seed << "), " << rotation
              << " rotation (seed " << rotation_seed << "), " << scale << " scale, "
              << (no_renorm ? "norm stored as is" : "renormalized") << ", "
              << (sphere ? "sphere" : "gaussian") << " codebook\n"
              << "bytes per vector: " << r.bytes_per_vector << " (" << r.code_bytes << " index + "
              << r.scale_bytes << " scale), "
              << static_cast<double>(fp16_bytes) / static_cast<double>(r.bytes_per_vector)
              << "x smaller than fp16 (" << fp16_bytes << ")\n"
              << "relative MSE E||x - x~||^2/||x||^2: " << r.relative_mse << " (Lloyd-Max theory "
              << r.theory_mse << ")\n"
              << "cosine(x, x~): mean " << std::setprecision(6) << r.cosine_mean << ", min " << r.cosine_min
              << "\n"
              << std::setprecision(4) << "inner product error (<y,x~> - <y,x>) / (||y|| ||x||): RMS "
              << r.ip_rmse << " (isotropic error of the theory MSE: " << r.ip_rmse_theory << "), mean "
              << r.ip_bias << "\n";
  });
}

}  // namespace

void add_kv_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("kv", "TurboQuant 4-bit KV cache tools: codebooks, round-trip quality checks");
  cmd->require_subcommand(1);
  add_codebook(*cmd);
  add_roundtrip(*cmd);
}

}  // namespace lowbit::cli
