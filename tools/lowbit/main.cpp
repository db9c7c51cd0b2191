// lowbit: command-line engine for LLM inference on compressed weights.
// Exit codes: 0 success, 2 usage error (bad flags or arguments, caught by the
// option parser and its validators), 1 any other error (bad files, I/O, CUDA).
#include <cstdio>
#include <exception>
#include <iostream>

#include "commands.h"
#include "lowbit/build_info.h"
#include "lowbit/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{
      "lowbit: memory-bound LLM inference on compressed data (4-bit weights, 4-bit KV caches,\n"
      "entropy-coded weights). Run 'lowbit COMMAND --help' for the options of a command."};
  app.name("lowbit");
  app.set_version_flag("--version", LOWBIT_VERSION);
  app.require_subcommand(1);
  lowbit::cli::add_env_command(app);
  lowbit::cli::add_inspect_command(app);
  lowbit::cli::add_quantize_command(app);
  lowbit::cli::add_dequantize_command(app);
  lowbit::cli::add_kv_command(app);
  lowbit::cli::add_ans_command(app);
  lowbit::cli::add_bench_command(app);
  lowbit::cli::add_generate_command(app);
  lowbit::cli::add_perplexity_command(app);
  try {
    app.parse(argc, argv);  // runs the chosen subcommand's callback
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);  // prints the help of the subcommand that was named, if any
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion&) {
    std::cout << "lowbit " << LOWBIT_VERSION << "\n";
    return 0;
  } catch (const CLI::ParseError& e) {
    std::cerr << "lowbit: " << e.what() << "\nRun 'lowbit --help' for usage.\n";
    return 2;
  } catch (const lowbit::Error& e) {
    std::cerr << "lowbit: " << lowbit::error_kind_name(e.kind()) << ": " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "lowbit: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
