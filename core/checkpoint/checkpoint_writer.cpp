#include "core/checkpoint/checkpoint_writer.h"

#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/io/file_io.h"
#include "core/checkpoint/metadata.h"
#include "core/checkpoint/save_dir.h"

static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian raw values");

namespace mt {
namespace {

constexpr int64_t kSliceAlignment = 64;  // every slice starts 64-byte aligned in its data file

ckpt::TensorEntry entry_for(const TensorSlice& t, const std::string& where) {
  auto fail = [&](const std::string& msg) {
    throw CheckpointError(fmt::format("{}: tensor {}: {}", where, t.name, msg));
  };
  if (!t.data.defined()) fail("no data");
  if (t.data.device() != Device::cpu) fail("data must be a host tensor");
  const size_t nd = t.global_shape.size();
  if (t.data.shape().size() != nd)
    fail(fmt::format("slice {} does not have the dimensions of the global shape {}", t.data.describe(),
                     shape_str(t.global_shape)));
  if (!t.start.empty() && t.start.size() != nd)
    fail(fmt::format("start [{}] does not match the global shape {}", fmt::join(t.start, ", "),
                     shape_str(t.global_shape)));
  ckpt::SliceEntry s;
  s.start = t.start.empty() ? std::vector<int64_t>(nd, 0) : t.start;
  s.extent = t.data.shape();
  s.bytes = static_cast<int64_t>(t.data.nbytes());
  ckpt::TensorEntry e{t.name, t.data.dtype(), t.global_shape, {std::move(s)}};
  return e;
}

}  // namespace

std::string checkpoint_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

std::string begin_checkpoint(const std::string& save_dir, int64_t iteration) {
  check_save_dir_writable(save_dir);
  // Only the run holding the save_dir's lock may take `.tmp.*` entries for leftovers of a crash: without it
  // they may be another live run's.
  if (ckpt::SaveDirLock::held(save_dir)) ckpt::remove_stale_tmp(save_dir);
  std::string tmp =
      io::join_path(save_dir, fmt::format("{}{}.{}", ckpt::kTmpPrefix, checkpoint_dir_name(iteration), ::getpid()));
  if (::mkdir(tmp.c_str(), 0755) != 0) io::throw_os_error(tmp, "cannot create directory", errno);
  return tmp;
}

void write_rank_files(const std::string& tmp_dir, int rank, const std::vector<TensorSlice>& tensors,
                      const ProgressHook& progress) {
  const std::string data_name = ckpt::rank_data_file(rank);
  const std::string data_path = io::join_path(tmp_dir, data_name);

  // Index first: a bad slice fails before anything is written.
  std::vector<ckpt::TensorEntry> index;
  std::vector<const TensorSlice*> order;  // the slices in file order, one per (tensor, slice) record
  for (const auto& t : tensors) {
    std::vector<ckpt::TensorEntry> one{entry_for(t, data_path)};
    ckpt::merge_tensor_entries(index, std::move(one), data_path);
    order.push_back(&t);
  }
  for (auto& e : index) {
    for (auto& s : e.slices) s.file = data_name;
    ckpt::check_tensor_entry(data_path, e);
  }

  // Data: slice k of the input goes to the record that merge appended for it, found by name in order.
  {
    io::OutFile out(data_path);
    std::vector<int64_t> slice_bytes;
    for (const TensorSlice* t : order) slice_bytes.push_back(static_cast<int64_t>(t->data.nbytes()));
    PieceCounter counter(progress, std::move(slice_bytes));
    std::map<std::string, size_t> next_slice, pos;
    for (size_t i = 0; i < index.size(); ++i) pos[index[i].name] = i;
    for (const TensorSlice* t : order) {
      ckpt::SliceEntry& s = index[pos[t->name]].slices[next_slice[t->name]++];
      out.pad_to(kSliceAlignment);
      s.offset = out.offset();
      s.crc = crc32(t->data.raw(), t->data.nbytes());
      out.write(t->data.raw(), t->data.nbytes());
      counter.piece_done();
    }
    out.sync_and_close();
  }

  // Read back what the file system now holds and check it against the checksums taken from memory.
  {
    const MappedFile in = io::map_file(data_path);
    const int64_t size = static_cast<int64_t>(in.size());
    for (const auto& e : index) {
      for (const auto& s : e.slices) {
        if (s.bytes > size || s.offset > size - s.bytes)
          throw CheckpointError(fmt::format("{}: holds {} bytes after writing, tensor {} needs bytes up to {}",
                                            data_path, size, e.name, s.offset + s.bytes));
        if (crc32(in.data() + s.offset, static_cast<size_t>(s.bytes)) != s.crc)
          throw CheckpointError(
              fmt::format("{}: checksum mismatch reading back tensor {} (slice start [{}]) "
                          "right after writing it — the storage is failing",
                          data_path, e.name, fmt::join(s.start, ", ")));
      }
    }
  }
  io::write_file_durably(io::join_path(tmp_dir, ckpt::rank_index_file(rank)), ckpt::emit_index_fragment(rank, index));
}

std::string commit_checkpoint(const std::string& save_dir, const std::string& tmp_dir, const CheckpointState& state,
                              int num_ranks, int64_t keep_last) {
  std::vector<ckpt::TensorEntry> tensors;
  for (int r = 0; r < num_ranks; ++r) {
    std::string path = io::join_path(tmp_dir, ckpt::rank_index_file(r));
    ckpt::merge_tensor_entries(tensors, ckpt::parse_index_fragment(path, io::read_text_file(path)), path);
  }
  const std::string meta_path = io::join_path(tmp_dir, ckpt::kMetadataFile);
  for (const auto& t : tensors) ckpt::check_tensor_entry(meta_path, t);  // disjoint across ranks too
  io::write_file_durably(meta_path, ckpt::emit_metadata(state, tensors));
  for (int r = 0; r < num_ranks; ++r) ::unlink(io::join_path(tmp_dir, ckpt::rank_index_file(r)).c_str());
  io::fsync_dir(tmp_dir);

  // Reopen: the metadata must parse and every slice must lie inside its data file. (Every writer has
  // already verified its slices' checksums after fsync.)
  CheckpointReader check(tmp_dir);
  if (check.tensors().size() != tensors.size() || check.state().iteration != state.iteration)
    throw CheckpointError(fmt::format("{}: does not read back as written", meta_path));

  const std::string name = checkpoint_dir_name(state.iteration);
  const std::string final = io::join_path(save_dir, name);
  ckpt::install_dir(save_dir, tmp_dir, final);
  ckpt::write_latest(save_dir, name);
  ckpt::apply_keep_last(save_dir, keep_last, name);
  return final;
}

void abort_checkpoint(const std::string& tmp_dir) noexcept { io::remove_tree(tmp_dir); }

std::string save_checkpoint(const std::string& save_dir, const CheckpointState& state,
                            const std::vector<TensorSlice>& tensors, int64_t keep_last, const ProgressHook& progress) {
  std::string tmp;
  try {
    if (state.iteration < 0) throw CheckpointError(fmt::format("iteration {} is negative", state.iteration));
    tmp = begin_checkpoint(save_dir, state.iteration);
    write_rank_files(tmp, 0, tensors, progress);
    return commit_checkpoint(save_dir, tmp, state, 1, keep_last);
  } catch (const FileError& e) {  // CheckpointError, or a file_io helper's error
    if (!tmp.empty()) abort_checkpoint(tmp);
    throw CheckpointError(
        fmt::format("saving checkpoint of iteration {} in {} failed: {}", state.iteration, save_dir, e.what()));
  } catch (...) {
    if (!tmp.empty()) abort_checkpoint(tmp);
    throw;
  }
}

}  // namespace mt
