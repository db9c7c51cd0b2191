// `lowbit dequantize IN OUT.safetensors`: a quantized checkpoint back to
// full-precision weights, for checking and debugging; with --reference it
// also reports each layer's error against the original weights.
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "commands.h"
#include "lowbit/checkpoint/quantized_checkpoint.h"
#include "lowbit/core/dtype.h"
#include "progress.h"

namespace lowbit::cli {

void add_dequantize_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "dequantize",
      "Write a quantized checkpoint (GPTQ v1/v2 or AWQ, detected from its config) back to\n"
      "full precision: every quantized layer becomes '<layer>.weight' [out, in]; all other\n"
      "tensors are copied. With --reference, print each layer's error against the original.");
  static std::string input, output, reference, dtype_name_option = "f16";
  cmd->add_option("IN", input, "Quantized checkpoint folder (or a .safetensors file with config.json beside it)")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("OUT", output, "The .safetensors file to write")->required();
  cmd->add_option("--dtype", dtype_name_option, "Output dtype of the dequantized weights: f16, bf16 or f32")
      ->check(CLI::IsMember({"f16", "bf16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--reference", reference,
                  "The original full-precision checkpoint: report per-layer relative L2 error, the largest\n"
                  "absolute error, and the largest error in units of the layer's scale (round-to-nearest\n"
                  "guarantees at most 0.5 plus fp16 rounding)")
      ->check(CLI::ExistingPath);
  cmd->callback([] {
    std::optional<std::filesystem::path> ref;
    if (!reference.empty()) ref = reference;
    std::unique_ptr<Progress> bar;
    const auto summary = checkpoint::dequantize_checkpoint(
        input, output, *parse_dtype(dtype_name_option), ref,
        [&](int64_t, int64_t total, const std::string& item) {
          if (!bar) bar = std::make_unique<Progress>("dequantizing", total);
          bar->advance(item);
        });
    if (bar) bar->finish();
    std::cout << "wrote " << output << ": " << summary.dequantized_layers << " layers dequantized to "
              << dtype_name_option << ", " << summary.copied_tensors << " tensors copied\n";
    if (!summary.errors.empty()) {
      double worst_rel = 0, worst_scales = 0;
      std::printf("%-48s  %12s  %12s  %14s\n", "layer", "rel. L2", "max |err|", "max err/scale");
      for (const auto& e : summary.errors) {
        std::printf("%-48s  %12.3e  %12.3e  %14.4f\n", e.name.c_str(), e.relative_l2, e.max_abs, e.max_in_scales);
        worst_rel = std::max(worst_rel, e.relative_l2);
        worst_scales = std::max(worst_scales, e.max_in_scales);
      }
      std::printf("worst: relative L2 %.3e, max error %.4f scales (round-to-nearest bound: 0.5 + fp16 rounding)\n",
                  worst_rel, worst_scales);
    }
  });
}

}  // namespace lowbit::cli
