// `lowbit env`: what this build is and what it runs on (version, build options,
// CPU, and each GPU with its measured copy bandwidth when --measure is given).
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "lowbit/build_info.h"
#include "lowbit/core/parallel.h"
#include "lowbit/cuda/device.h"

namespace lowbit::cli {
namespace {

std::string read_proc_field(const char* file, const std::string& key) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      const auto colon = line.find(':');
      if (colon == std::string::npos) continue;
      auto value = line.substr(colon + 1);
      const auto first = value.find_first_not_of(" \t");
      return first == std::string::npos ? "" : value.substr(first);
    }
  }
  return "";
}

std::string cpu_simd_flags() {
  const std::string flags = " " + read_proc_field("/proc/cpuinfo", "flags") + " ";
  std::string out;
  for (const char* f : {"avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile"})
    if (flags.find(" " + std::string(f) + " ") != std::string::npos) out += (out.empty() ? "" : " ") + std::string(f);
  return out.empty() ? "(none of avx2/fma/f16c/avx512)" : out;
}

nlohmann::json collect(bool measure) {
  nlohmann::json env;
  env["version"] = LOWBIT_VERSION;
  env["build"] = {{"type", LOWBIT_BUILD_TYPE},
                  {"cxx_compiler", LOWBIT_CXX_COMPILER},
                  {"cuda_option", LOWBIT_CUDA_OPTION},
                  {"cuda_built", cuda_built()}};
  if (cuda_built()) {
    env["build"]["cuda_compiler"] = LOWBIT_CUDA_COMPILER;
    env["build"]["cuda_architectures"] = LOWBIT_CUDA_ARCHITECTURES;
  }
  env["cpu"] = {{"model", read_proc_field("/proc/cpuinfo", "model name")},
                {"hardware_threads", std::thread::hardware_concurrency()},
                {"lowbit_threads", num_threads()},
                {"simd", cpu_simd_flags()},
                {"memory", read_proc_field("/proc/meminfo", "MemTotal")}};
  nlohmann::json gpus = nlohmann::json::array();
  const int count = cuda_device_count();
  for (int i = 0; i < count; ++i) {
    const CudaDeviceInfo d = cuda_device_info(i);
    nlohmann::json g = {{"index", d.index},
                        {"name", d.name},
                        {"compute_capability", std::to_string(d.cc_major) + "." + std::to_string(d.cc_minor)},
                        {"sm_count", d.sm_count},
                        {"memory_total_bytes", d.total_memory},
                        {"memory_free_bytes", d.free_memory},
                        {"l2_bytes", d.l2_bytes},
                        {"peak_bandwidth_GBps", d.peak_bandwidth_GBps},
                        {"driver", d.driver_version},
                        {"runtime", d.runtime_version}};
    if (measure) g["measured_copy_GBps"] = measure_copy_bandwidth_GBps(i);
    gpus.push_back(g);
  }
  env["gpus"] = gpus;
  return env;
}

void print_text(const nlohmann::json& env, bool measure) {
  std::cout << "lowbit " << env["version"].get<std::string>() << "\n"
            << "build:  " << env["build"]["type"].get<std::string>() << ", "
            << env["build"]["cxx_compiler"].get<std::string>() << ", CUDA "
            << (env["build"]["cuda_built"].get<bool>()
                    ? "on (" + env["build"]["cuda_compiler"].get<std::string>() + ", arch " +
                          env["build"]["cuda_architectures"].get<std::string>() + ")"
                    : "off (LOWBIT_CUDA=" + env["build"]["cuda_option"].get<std::string>() + ")")
            << "\n"
            << "cpu:    " << env["cpu"]["model"].get<std::string>() << ", "
            << env["cpu"]["hardware_threads"] << " threads (lowbit uses "
            << env["cpu"]["lowbit_threads"] << "), " << env["cpu"]["simd"].get<std::string>()
            << ", memory " << env["cpu"]["memory"].get<std::string>() << "\n";
  if (env["gpus"].empty()) {
    std::cout << "gpu:    none" << (cuda_built() ? " (no CUDA device visible)" : " (built without CUDA)")
              << "\n";
    return;
  }
  for (const auto& g : env["gpus"]) {
    std::cout << "gpu " << g["index"] << ": " << g["name"].get<std::string>() << ", sm_"
              << g["compute_capability"].get<std::string>() << ", " << g["sm_count"] << " SMs, "
              << g["memory_total_bytes"].get<double>() / (1 << 30) << " GiB, L2 "
              << g["l2_bytes"].get<double>() / (1 << 20) << " MiB, driver "
              << g["driver"].get<std::string>() << "\n";
    if (measure)
      std::cout << "        measured device-to-device copy: " << g["measured_copy_GBps"].get<double>()
                << " GB/s (bytes read + written)\n";
  }
}

}  // namespace

void add_env_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "env", "Show the lowbit version, build options, CPU and GPUs (with --measure: copy bandwidth)");
  static bool measure = false;
  static bool json = false;
  cmd->add_flag("--measure", measure,
                "Measure each GPU's device-to-device copy bandwidth (bytes read + written), the "
                "ceiling that memory-bound kernels are compared with");
  cmd->add_flag("--json", json, "Print JSON instead of text");
  cmd->callback([] {
    const nlohmann::json env = collect(measure);
    if (json)
      std::cout << env.dump(2) << "\n";
    else
      print_text(env, measure);
  });
}

}  // namespace lowbit::cli
