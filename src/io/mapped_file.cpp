#include "lowbit/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#include "lowbit/core/error.h"

namespace lowbit::io {

MappedFile MappedFile::open(const std::filesystem::path& path, const std::string& what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    fail(ErrorKind::io, "cannot open ", what, ": ", std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(ErrorKind::io, "cannot stat ", what, ": ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(ErrorKind::io, what, " is not a regular file", S_ISDIR(st.st_mode) ? " (it is a directory)" : "");
  }
  MappedFile f;
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > std::numeric_limits<size_t>::max()) {
    ::close(fd);
    fail(ErrorKind::unsupported, what, " is too large to map (", f.size_, " bytes)");
  }
  if (f.size_ == 0) {  // mmap refuses length 0; an empty file is an empty span
    ::close(fd);
    return f;
  }
  void* map = ::mmap(nullptr, static_cast<size_t>(f.size_), PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    fail(ErrorKind::io, "cannot memory-map ", what, " (", f.size_, " bytes): ", std::strerror(map_err));
  }
  f.map_ = map;
  return f;
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : map_(std::exchange(other.map_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    release();
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { release(); }

void MappedFile::release() noexcept {
  if (map_ != nullptr) ::munmap(map_, static_cast<size_t>(size_));
  map_ = nullptr;
  size_ = 0;
}

}  // namespace lowbit::io
