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

// Every problem with a data file (datasets, tokenizer files); the message names the file and what is wrong with it.
// A FileError, as the file_io helpers' errors (core/io/file_io.h) that the writers let through are.
class DataError : public FileError {
 public:
  using FileError::FileError;
};

}  // namespace mt
