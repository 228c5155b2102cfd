// tensorboard.h: TensorBoard event files of scalar summaries, readable by TensorBoard and its EventAccumulator.
//
// A file events.out.tfevents.<unix seconds>.<host>.<pid>.<writer> holds TFRecords (uint64 length, masked CRC-32C of the
// length, the bytes, masked CRC-32C of the bytes), each an Event protobuf: the first says file_version
// "brain.Event:2", the rest hold one Summary.Value {tag, simple_value} each with wall_time and step. The
// few fields are encoded by hand (field numbers of TensorFlow's event.proto and summary.proto): the protobuf
// library would add a build dependency and a code generator for five scalar fields.
#pragma once
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace mt {

// Seconds since the Unix epoch, as TensorBoard's wall_time.
double unix_time_now();

class TensorBoardWriter {
 public:
  // Creates `dir` when missing and starts a new event file in it (a resumed run adds a file; TensorBoard
  // reads all of a directory's files). Throws std::runtime_error naming the path when it cannot.
  explicit TensorBoardWriter(const std::string& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // One scalar point of the curve `tag` (e.g. "lm-loss-training/loss"). Buffered: call flush() after a
  // group of points (a logging interval) so that a running TensorBoard sees them. A failed write (a full disk)
  // closes the file and throws FileError "tensorboard: cannot write PATH: OS error".
  void scalar(std::string_view tag, int64_t step, float value, double wall_time = unix_time_now());
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& data);
  [[noreturn]] void throw_write_error();

  std::string path_;
  std::ofstream out_;
};

}  // namespace mt
