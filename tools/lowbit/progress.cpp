#include "progress.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>

namespace lowbit::cli {
namespace {
double now_seconds() {
  using clock = std::chrono::steady_clock;
  return std::chrono::duration<double>(clock::now().time_since_epoch()).count();
}
}  // namespace

Progress::Progress(std::string what, int64_t total)
    : what_(std::move(what)), total_(total), tty_(isatty(STDERR_FILENO) == 1),
      start_seconds_(now_seconds()) {}

Progress::~Progress() {
  if (tty_ && !finished_ && done_ > 0) std::fputc('\n', stderr);
}

void Progress::advance(const std::string& item) {
  ++done_;
  draw(item);
}

void Progress::draw(const std::string& item) {
  const double fraction = total_ > 0 ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  const double elapsed = now_seconds() - start_seconds_;
  if (tty_) {
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(static_cast<size_t>(filled), '=');
    bar.resize(kWidth, ' ');
    std::string shown = item.size() > 40 ? "..." + item.substr(item.size() - 37) : item;
    std::fprintf(stderr, "\r%s [%s] %lld/%lld %5.1fs %-40s", what_.c_str(), bar.c_str(),
                 static_cast<long long>(done_), static_cast<long long>(total_), elapsed,
                 shown.c_str());
    std::fflush(stderr);
    return;
  }
  // Logs get a line per tenth of the way, and none at all for jobs under a second.
  const int decile = static_cast<int>(fraction * 10);
  if (decile != last_decile_ && elapsed >= 1.0) {
    last_decile_ = decile;
    std::fprintf(stderr, "%s: %lld/%lld (%d%%) %.1fs\n", what_.c_str(),
                 static_cast<long long>(done_), static_cast<long long>(total_),
                 static_cast<int>(fraction * 100), elapsed);
  }
}

void Progress::finish() {
  if (finished_) return;
  finished_ = true;
  if (tty_ && done_ > 0) std::fputc('\n', stderr);
}

}  // namespace lowbit::cli
