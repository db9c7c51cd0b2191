// A progress bar for long work (quantizing a checkpoint). On a terminal it
// redraws one line on stderr; otherwise (logs, CI) it prints a line at every
// tenth of the way so the log shows progress without flooding it.
#pragma once

#include <cstdint>
#include <string>

namespace lowbit::cli {

class Progress {
 public:
  Progress(std::string what, int64_t total);
  ~Progress();
  void advance(const std::string& item);  // one more unit done; `item` names it
  void finish();

 private:
  void draw(const std::string& item);
  std::string what_;
  int64_t total_;
  int64_t done_ = 0;
  int last_decile_ = -1;
  bool tty_;
  bool finished_ = false;
  double start_seconds_;
};

}  // namespace lowbit::cli
