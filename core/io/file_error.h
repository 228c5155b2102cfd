// file_error.h: FileError, the base of every error about a file (MapFileError, the file_io helpers', and the
// checkpoint and data rooms' CheckpointError and DataError), so a caller can catch "a file problem" in one place.
#pragma once
#include <stdexcept>

namespace mt {

// Names the path and what went wrong; for a failed system call, "PATH: WHAT: strerror".
class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace mt
