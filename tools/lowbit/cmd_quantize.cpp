// `lowbit quantize IN_DIR OUT_DIR`: round-to-nearest 4-bit quantization of
// every linear layer of a Hugging Face checkpoint, written as a GPTQ or AWQ
// checkpoint that the tools reading those formats load.
#include <iostream>
#include <memory>
#include <string>

#include "commands.h"
#include "lowbit/checkpoint/quantized_checkpoint.h"
#include "progress.h"

namespace lowbit::cli {

void add_quantize_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "quantize",
      "Quantize every linear layer of a Hugging Face checkpoint (config.json + *.safetensors,\n"
      "fp16/bf16/fp32) to 4 bits with round-to-nearest (min-max) and write a GPTQ or AWQ\n"
      "checkpoint. Embeddings, norms and lm_head stay as they are. The output folder is\n"
      "assembled beside OUT_DIR and moved into place only when complete.");
  static std::string input, output;
  static int bits = 4;
  static int group_size = 128;
  static std::string format = "gptq";
  static bool sym = false;
  static bool force = false;
  cmd->add_option("IN_DIR", input, "Checkpoint folder to quantize")->required()->check(CLI::ExistingDirectory);
  cmd->add_option("OUT_DIR", output, "Folder to write (new or empty, unless --force)")->required();
  cmd->add_option("--bits", bits, "Bits per weight (only 4 is supported)")
      ->check(CLI::IsMember({4}))
      ->capture_default_str();
  cmd->add_option("--group-size", group_size,
                  "Rows of K (in_features) sharing one scale and zero: 32, 64, 128, 256, or -1 for\n"
                  "one group per output channel")
      ->check(CLI::IsMember({32, 64, 128, 256, -1}))
      ->capture_default_str();
  cmd->add_option("--format", format,
                  "gptq: AutoGPTQ layout (qweight packed along K, zeros stored minus one);\n"
                  "gptq_v2: GPTQModel's v2 (zeros stored as they are);\n"
                  "awq: AutoAWQ GEMM layout (qweight packed along N, order 0 2 4 6 1 3 5 7)")
      ->check(CLI::IsMember({"gptq", "gptq_v2", "awq"}))
      ->capture_default_str();
  cmd->add_flag("--sym", sym, "Symmetric quantization (zero point 8, scale = 2*max|w|/15) instead of\nasymmetric min-max");
  cmd->add_flag("--force", force, "Replace OUT_DIR if it exists and is not empty");
  cmd->callback([] {
    checkpoint::QuantizeOptions options;
    options.format = *checkpoint::parse_quant_format(format);
    options.bits = bits;
    options.group_size = group_size;
    options.sym = sym;
    options.overwrite = force;
    std::unique_ptr<Progress> bar;
    const auto summary = checkpoint::quantize_checkpoint(
        input, output, options, [&](int64_t done, int64_t total, const std::string& item) {
          if (!bar) bar = std::make_unique<Progress>("quantizing", total);
          (void)done;
          bar->advance(item);
        });
    if (bar) bar->finish();
    std::cout << "wrote " << output << ": " << summary.quantized_layers << " linear layers quantized ("
              << format << ", " << bits << " bits, group size " << group_size << ", "
              << (sym ? "symmetric" : "asymmetric") << "), " << summary.copied_tensors
              << " tensors copied as they were";
    if (!summary.copied_files.empty()) std::cout << ", " << summary.copied_files.size() << " other files copied";
    std::cout << "\ntensor bytes: " << summary.input_tensor_bytes << " -> " << summary.output_tensor_bytes << " ("
              << static_cast<double>(summary.input_tensor_bytes) / static_cast<double>(summary.output_tensor_bytes)
              << "x smaller)\n";
  });
}

}  // namespace lowbit::cli
