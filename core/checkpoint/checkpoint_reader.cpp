#include <algorithm>
#include <cstring>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/checkpoint/checkpoint.h"
#include "core/io/file_io.h"
#include "core/checkpoint/metadata.h"
#include "core/checkpoint/save_dir.h"

namespace mt {
namespace {

int64_t load_int(const unsigned char* p, DType t) {
  if (t == DType::i32) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

float load_float(const unsigned char* p, DType t) {
  uint16_t h;
  float f;
  switch (t) {
    case DType::f32:
      std::memcpy(&f, p, 4);
      return f;
    case DType::bf16:
      std::memcpy(&h, p, 2);
      return bf16_to_float(h);
    case DType::f16:
      std::memcpy(&h, p, 2);
      return f16_to_float(h);
    case DType::f64: {
      double d;
      std::memcpy(&d, p, 8);
      return static_cast<float>(d);
    }
    case DType::e4m3:
      return e4m3_to_float(*p);
    case DType::e5m2:
      return e5m2_to_float(*p);
    default:
      return static_cast<float>(load_int(p, t));
  }
}

void store(unsigned char* p, DType t, float f, int64_t i, bool from_int) {
  switch (t) {
    case DType::f32:
      std::memcpy(p, &f, 4);
      return;
    case DType::bf16: {
      uint16_t h = float_to_bf16(f);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::f16: {
      uint16_t h = float_to_f16(f);
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::i32: {
      auto v = static_cast<int32_t>(from_int ? i : static_cast<int64_t>(f));
      std::memcpy(p, &v, 4);
      return;
    }
    case DType::i64: {
      int64_t v = from_int ? i : static_cast<int64_t>(f);
      std::memcpy(p, &v, 8);
      return;
    }
    case DType::f64: {
      double v = from_int ? static_cast<double>(i) : f;
      std::memcpy(p, &v, 8);
      return;
    }
    case DType::e4m3:
      *p = float_to_e4m3(f);
      return;
    case DType::e5m2:
      *p = float_to_e5m2(f);
      return;
  }
}

// n consecutive values, converted as Tensor::copy_from does (integers between integer dtypes exactly).
void convert_run(const unsigned char* src, DType st, unsigned char* dst, DType dt, int64_t n) {
  if (st == dt) {
    std::memcpy(dst, src, static_cast<size_t>(n) * dtype_size(st));
    return;
  }
  const size_t ss = dtype_size(st), ds = dtype_size(dt);
  auto not_float = [](DType t) { return !is_floating(t) && !is_fp8(t); };  // the integers (and f64, as before)
  const bool ints = not_float(st) && not_float(dt);
  for (int64_t i = 0; i < n; ++i, src += ss, dst += ds)
    ints ? store(dst, dt, 0.f, load_int(src, st), true) : store(dst, dt, load_float(src, st), 0, false);
}

// Copies the box of `extent` at `src_at` inside the row-major array `src` (shape src_shape) to `dst_at`
// inside `dst` (shape dst_shape), converting dtypes.
void copy_box(const unsigned char* src, DType st, const Shape& src_shape, const std::vector<int64_t>& src_at,
              unsigned char* dst, DType dt, const Shape& dst_shape, const std::vector<int64_t>& dst_at,
              const std::vector<int64_t>& extent) {
  const size_t nd = extent.size();
  if (nd == 0) return convert_run(src, st, dst, dt, 1);
  for (auto e : extent)
    if (e == 0) return;
  std::vector<int64_t> idx(nd, 0);  // position inside the box; the last dimension is copied as one run
  for (;;) {
    int64_t so = 0, doff = 0;
    for (size_t d = 0; d < nd; ++d) {
      so = so * src_shape[d] + src_at[d] + idx[d];
      doff = doff * dst_shape[d] + dst_at[d] + idx[d];
    }
    convert_run(src + so * static_cast<int64_t>(dtype_size(st)), st, dst + doff * static_cast<int64_t>(dtype_size(dt)),
                dt, extent[nd - 1]);
    size_t d = nd - 1;
    while (d > 0) {
      if (++idx[d - 1] < extent[d - 1]) break;
      idx[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}

}  // namespace

CheckpointReader::CheckpointReader(const std::string& dir) : dir_(dir) {
  const std::string meta_path = io::join_path(dir_, ckpt::kMetadataFile);
  switch (io::path_kind(dir_)) {
    case io::PathKind::directory:
      break;
    case io::PathKind::missing:
      throw CheckpointRemoved(fmt::format("{}: checkpoint directory does not exist", dir_));
    default:
      throw CheckpointError(fmt::format("{}: is not a checkpoint directory", dir_));
  }
  lease_ = std::make_shared<const ckpt::CheckpointLease>(dir_);
  if (io::path_kind(meta_path) == io::PathKind::missing)
    throw CheckpointError(fmt::format("{}: missing — {} is not a checkpoint (or an incomplete one)", meta_path, dir_));
  ckpt::Metadata m = ckpt::parse_metadata(meta_path, io::read_text_file(meta_path));
  state_ = std::move(m.state);

  std::map<std::string, int64_t> file_sizes;  // every data file named, checked once
  for (auto& t : m.tensors) {
    auto& records = slices_[t.name];
    for (auto& s : t.slices) {
      auto [it, fresh] = file_sizes.emplace(s.file, 0);
      std::string path = io::join_path(dir_, s.file);
      if (fresh) {
        if (io::path_kind(path) != io::PathKind::file)
          throw CheckpointError(fmt::format("{}: data file missing (tensor {} is stored there)", path, t.name));
        it->second = io::file_size(path);
      }
      if (s.bytes > it->second || s.offset > it->second - s.bytes)  // overflow-safe offset + bytes > size
        throw CheckpointError(
            fmt::format("{}: has {} bytes but tensor {} (slice start [{}]) needs bytes [{}, {}) — "
                        "the file is truncated",
                        path, it->second, t.name, fmt::join(s.start, ", "), s.offset, s.offset + s.bytes));
      records.push_back(SliceRecord{s.file, s.offset, s.bytes, std::move(s.start), std::move(s.extent), s.crc});
    }
    infos_.push_back(TensorInfo{t.name, t.dtype, std::move(t.shape)});
  }
}

CheckpointReader open_checkpoint(const std::string& path) {
  // A live run with keep_last 1 replaces its checkpoint at every save; each read of `latest` can lose that race
  // only to a newer save, so a few rounds suffice.
  constexpr int kRounds = 8;
  std::string last_error;
  for (int round = 1;; ++round) {
    std::optional<std::string> dir;
    try {
      dir = resolve_checkpoint(path);
      if (!dir) throw CheckpointError(fmt::format("{}: no checkpoint there (no metadata.yaml, no latest)", path));
      return CheckpointReader(*dir);
    } catch (const CheckpointRemoved& e) {
      if (dir && *dir == path)
        throw CheckpointRemoved(fmt::format(
            "{} — removed, as the keep_last of a live run writing its save directory removes older checkpoints; "
            "name the save directory to read its newest checkpoint",
            e.what()));
      if (e.what() == last_error) throw;  // the same twice: no race with a newer save, a missing checkpoint
      last_error = e.what();
      if (round == kRounds)
        throw CheckpointRemoved(
            fmt::format("{} — {} checkpoints named by {}/latest in a row were removed before "
                        "they could be opened (by the keep_last of a live run?)",
                        e.what(), kRounds, path));
    }
  }
}

bool CheckpointReader::has(const std::string& name) const { return slices_.count(name) > 0; }

const TensorInfo& CheckpointReader::info(const std::string& name) const {
  for (const auto& t : infos_)
    if (t.name == name) return t;
  throw CheckpointError(fmt::format("{}: checkpoint has no tensor '{}'", dir_, name));
}

size_t CheckpointReader::num_slices(const std::string& name) const {
  info(name);
  return slices_.at(name).size();
}

uint32_t CheckpointReader::stored_checksum(const std::string& prefix) const {
  std::vector<const TensorInfo*> tensors;
  for (const auto& t : infos_)
    if (t.name.compare(0, prefix.size(), prefix) == 0) tensors.push_back(&t);
  std::sort(tensors.begin(), tensors.end(), [](const TensorInfo* a, const TensorInfo* b) { return a->name < b->name; });
  uint32_t crc = 0;
  auto add = [&crc](const std::string& text) { crc = crc32(text.data(), text.size(), crc); };
  for (const TensorInfo* t : tensors) {
    add(fmt::format("{} {} [{}]\n", t->name, dtype_name(t->dtype), fmt::join(t->global_shape, ",")));
    std::vector<const SliceRecord*> slices;
    for (const auto& s : slices_.at(t->name)) slices.push_back(&s);
    std::sort(slices.begin(), slices.end(),
              [](const SliceRecord* a, const SliceRecord* b) { return a->start < b->start; });
    for (const SliceRecord* s : slices)
      add(fmt::format("[{}] [{}] {:08x}\n", fmt::join(s->start, ","), fmt::join(s->extent, ","), s->crc));
  }
  return crc;
}

const MappedFile& CheckpointReader::file(const std::string& name) const {
  auto it = files_.find(name);
  if (it == files_.end())
    it = files_.emplace(name, std::make_shared<const MappedFile>(io::map_file(io::join_path(dir_, name)))).first;
  return *it->second;
}

void CheckpointReader::verify(const std::string& tensor, const SliceRecord& s) const {
  if (s.verified) return;
  const MappedFile& f = file(s.file);
  const int64_t size = static_cast<int64_t>(f.size());
  std::string path = io::join_path(dir_, s.file);
  if (s.bytes > size || s.offset > size - s.bytes)
    throw CheckpointError(fmt::format("{}: truncated to {} bytes; tensor {} needs bytes up to {}", path, size, tensor,
                                      s.offset + s.bytes));
  if (crc32(f.data() + s.offset, static_cast<size_t>(s.bytes)) != s.crc)
    throw CheckpointError(
        fmt::format("{}: checksum mismatch in tensor {} (slice start [{}]) — the checkpoint is corrupted", path, tensor,
                    fmt::join(s.start, ", ")));
  s.verified = true;
}

void CheckpointReader::read(const std::string& name, Tensor& out, const std::vector<int64_t>& start_in) const {
  const TensorInfo& ti = info(name);
  const size_t nd = ti.global_shape.size();
  std::vector<int64_t> start = start_in.empty() ? std::vector<int64_t>(nd, 0) : start_in;
  auto region = [&] {
    return fmt::format("region start [{}] extent {}", fmt::join(start, ", "), shape_str(out.shape()));
  };
  if (!out.defined() || out.device() != Device::cpu)
    throw CheckpointError(fmt::format("{}: reading tensor {}: the destination must be a host tensor", dir_, name));
  if (out.shape().size() != nd || start.size() != nd)
    throw CheckpointError(fmt::format("{}: tensor {} has shape {}; {} has other dimensions", dir_, name,
                                      shape_str(ti.global_shape), region()));
  for (size_t d = 0; d < nd; ++d)
    if (start[d] < 0 || start[d] > ti.global_shape[d] || out.shape()[d] > ti.global_shape[d] - start[d])
      throw CheckpointError(fmt::format("{}: tensor {} has shape {}; {} lies outside it", dir_, name,
                                        shape_str(ti.global_shape), region()));

  // Which stored slices meet the region, and how much of it they cover (slices are disjoint).
  struct Piece {
    const SliceRecord* slice;
    std::vector<int64_t> lo, extent;  // the intersection, global coordinates
  };
  std::vector<Piece> pieces;
  int64_t covered = 0;
  for (const auto& s : slices_.at(name)) {
    Piece p{&s, std::vector<int64_t>(nd), std::vector<int64_t>(nd)};
    int64_t vol = 1;
    for (size_t d = 0; d < nd; ++d) {
      p.lo[d] = std::max(start[d], s.start[d]);
      int64_t hi = std::min(start[d] + out.shape()[d], s.start[d] + s.extent[d]);
      p.extent[d] = std::max<int64_t>(hi - p.lo[d], 0);
      vol *= p.extent[d];
    }
    if (vol == 0) continue;
    covered += vol;
    pieces.push_back(std::move(p));
  }
  if (covered != out.numel())
    throw CheckpointError(fmt::format("{}: tensor {}: {} is not fully covered by the stored slices ({} of {} values)",
                                      dir_, name, region(), covered, out.numel()));

  for (const auto& p : pieces) {
    verify(name, *p.slice);
    std::vector<int64_t> src_at(nd), dst_at(nd);
    for (size_t d = 0; d < nd; ++d) {
      src_at[d] = p.lo[d] - p.slice->start[d];
      dst_at[d] = p.lo[d] - start[d];
    }
    copy_box(file(p.slice->file).data() + p.slice->offset, ti.dtype, p.slice->extent, src_at,
             static_cast<unsigned char*>(out.raw()), out.dtype(), out.shape(), dst_at, p.extent);
  }
}

void CheckpointReader::verify_all() const {
  for (const auto& t : infos_)
    for (const auto& s : slices_.at(t.name)) verify(t.name, s);
}

}  // namespace mt
