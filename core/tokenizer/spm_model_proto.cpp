// spm_model_proto.cpp: a protobuf wire-format reader just big enough for sentencepiece.ModelProto (see
// spm_model_proto.h). The wire format: each field is a varint key (field number << 3 | wire type) and a value:
// 0 varint, 1 eight bytes, 2 length-delimited (strings, bytes, nested messages), 5 four bytes.
#include "core/tokenizer/spm_model_proto.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "core/io/file_error.h"  // DataError

namespace mt {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

struct Field {
  uint32_t number = 0;
  WireType wire = kVarint;
  uint64_t varint = 0;    // kVarint; kFixed32 / kFixed64 bits
  std::string_view data;  // kLengthDelimited
};

// Reads the fields of one message in order. `where` ("ModelProto.trainer_spec", ...) goes into errors.
class WireReader {
 public:
  WireReader(std::string_view bytes, const std::string& file, std::string where)
      : rest_(bytes), file_(file), where_(std::move(where)) {}

  bool next(Field& f) {
    if (rest_.empty()) return false;
    const uint64_t key = varint("a field key");
    f.number = static_cast<uint32_t>(key >> 3);
    f.wire = static_cast<WireType>(key & 7);
    if (f.number == 0) fail(fmt::format("field number 0 (key {:#x})", key));
    switch (f.wire) {
      case kVarint:
        f.varint = varint(fmt::format("field {}", f.number));
        break;
      case kFixed64:
        f.varint = fixed(8, f.number);
        break;
      case kFixed32:
        f.varint = fixed(4, f.number);
        break;
      case kLengthDelimited: {
        const uint64_t n = varint(fmt::format("the length of field {}", f.number));
        if (n > rest_.size())
          fail(fmt::format("field {} says {} bytes, only {} remain (truncated file?)", f.number, n, rest_.size()));
        f.data = rest_.substr(0, n);
        rest_.remove_prefix(n);
        break;
      }
      default:
        fail(fmt::format("field {} has wire type {} (groups and unknown types are not used by ModelProto)", f.number,
                         static_cast<uint32_t>(f.wire)));
    }
    return true;
  }

  // Checks that field f has the wire type its proto declaration implies.
  void expect(const Field& f, WireType want, const char* name) const {
    if (f.wire != want)
      fail(fmt::format("field {} ({}) has wire type {}, expected {}", f.number, name, static_cast<uint32_t>(f.wire),
                       static_cast<uint32_t>(want)));
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw DataError(fmt::format("{}: not a valid SentencePiece model: {}: {}", file_, where_, what));
  }

 private:
  uint64_t varint(const std::string& what) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (rest_.empty()) fail(fmt::format("{} ends inside a varint (truncated file?)", what));
      const auto b = static_cast<uint8_t>(rest_.front());
      rest_.remove_prefix(1);
      v |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (b < 0x80) return v;
    }
    fail(fmt::format("{} is a varint longer than 10 bytes", what));
  }

  uint64_t fixed(size_t n, uint32_t number) {
    if (rest_.size() < n) fail(fmt::format("field {} needs {} bytes, only {} remain", number, n, rest_.size()));
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(rest_[i])) << (8 * i);
    rest_.remove_prefix(n);
    return v;
  }

  std::string_view rest_;
  const std::string& file_;
  std::string where_;
};

// int32 fields are varints of the sign-extended 64-bit value (-1 takes ten bytes).
int32_t as_int32(const WireReader& r, const Field& f, const char* name) {
  r.expect(f, kVarint, name);
  const auto v = static_cast<int64_t>(f.varint);
  if (v < INT32_MIN || v > INT32_MAX) r.fail(fmt::format("{} = {} does not fit an int32", name, v));
  return static_cast<int32_t>(v);
}

bool as_bool(const WireReader& r, const Field& f, const char* name) {
  r.expect(f, kVarint, name);
  return f.varint != 0;
}

std::string as_string(const WireReader& r, const Field& f, const char* name) {
  r.expect(f, kLengthDelimited, name);
  return std::string(f.data);
}

SpmPiece parse_piece(std::string_view bytes, const std::string& file, size_t index) {
  WireReader r(bytes, file, fmt::format("ModelProto.pieces[{}]", index));
  SpmPiece p;
  for (Field f; r.next(f);) {
    if (f.number == 1) {
      p.piece = as_string(r, f, "piece");
    } else if (f.number == 2) {
      r.expect(f, kFixed32, "score");
      const auto bits = static_cast<uint32_t>(f.varint);
      std::memcpy(&p.score, &bits, sizeof bits);
    } else if (f.number == 3) {
      const int32_t t = as_int32(r, f, "type");
      if (t < 1 || t > 6) r.fail(fmt::format("type = {} is not a SentencePiece piece type (1..6)", t));
      p.type = static_cast<SpmPieceType>(t);
    }
  }
  return p;
}

SpmTrainerSpec parse_trainer(std::string_view bytes, const std::string& file) {
  WireReader r(bytes, file, "ModelProto.trainer_spec");
  SpmTrainerSpec t;
  for (Field f; r.next(f);) {
    switch (f.number) {
      case 3: {
        const int32_t m = as_int32(r, f, "model_type");
        if (m < 1 || m > 4) r.fail(fmt::format("model_type = {} is not UNIGRAM, BPE, WORD or CHAR (1..4)", m));
        t.model_type = static_cast<SpmModelType>(m);
        break;
      }
      case 4:
        t.vocab_size = as_int32(r, f, "vocab_size");
        break;
      case 22:
        t.split_by_whitespace = as_bool(r, f, "split_by_whitespace");
        break;
      case 24:
        t.treat_whitespace_as_suffix = as_bool(r, f, "treat_whitespace_as_suffix");
        break;
      case 26:
        t.allow_whitespace_only_pieces = as_bool(r, f, "allow_whitespace_only_pieces");
        break;
      case 35:
        t.byte_fallback = as_bool(r, f, "byte_fallback");
        break;
      case 40:
        t.unk_id = as_int32(r, f, "unk_id");
        break;
      case 41:
        t.bos_id = as_int32(r, f, "bos_id");
        break;
      case 42:
        t.eos_id = as_int32(r, f, "eos_id");
        break;
      case 43:
        t.pad_id = as_int32(r, f, "pad_id");
        break;
      case 44:
        t.unk_surface = as_string(r, f, "unk_surface");
        break;
      case 45:
        t.unk_piece = as_string(r, f, "unk_piece");
        break;
      case 46:
        t.bos_piece = as_string(r, f, "bos_piece");
        break;
      case 47:
        t.eos_piece = as_string(r, f, "eos_piece");
        break;
      case 48:
        t.pad_piece = as_string(r, f, "pad_piece");
        break;
      default:
        break;  // training-only options
    }
  }
  return t;
}

SpmNormalizerSpec parse_normalizer(std::string_view bytes, const std::string& file) {
  WireReader r(bytes, file, "ModelProto.normalizer_spec");
  SpmNormalizerSpec n;
  for (Field f; r.next(f);) {
    switch (f.number) {
      case 1:
        n.name = as_string(r, f, "name");
        break;
      case 2:
        n.precompiled_charsmap = as_string(r, f, "precompiled_charsmap");
        break;
      case 3:
        n.add_dummy_prefix = as_bool(r, f, "add_dummy_prefix");
        break;
      case 4:
        n.remove_extra_whitespaces = as_bool(r, f, "remove_extra_whitespaces");
        break;
      case 5:
        n.escape_whitespaces = as_bool(r, f, "escape_whitespaces");
        break;
      default:
        break;  // normalization_rule_tsv: training only
    }
  }
  return n;
}

}  // namespace

SpmModelProto parse_spm_model(std::string_view bytes, const std::string& name) {
  WireReader r(bytes, name, "ModelProto");
  SpmModelProto m;
  for (Field f; r.next(f);) {
    if (f.number == 1) {
      r.expect(f, kLengthDelimited, "pieces");
      m.pieces.push_back(parse_piece(f.data, name, m.pieces.size()));
    } else if (f.number == 2) {
      r.expect(f, kLengthDelimited, "trainer_spec");
      m.trainer = parse_trainer(f.data, name);
    } else if (f.number == 3) {
      r.expect(f, kLengthDelimited, "normalizer_spec");
      m.normalizer = parse_normalizer(f.data, name);
    }  // 4 self_test_data, 5 denormalizer_spec: not needed to encode
  }
  if (m.pieces.empty()) r.fail("no pieces (field 1)");
  const auto n = static_cast<int32_t>(m.pieces.size());
  if (m.trainer.unk_id < 0 || m.trainer.unk_id >= n)
    r.fail(fmt::format("trainer_spec.unk_id = {} is outside the {} pieces (SentencePiece requires an unknown piece)",
                       m.trainer.unk_id, n));
  if (m.pieces[m.trainer.unk_id].type != SpmPieceType::unknown)
    r.fail(fmt::format("trainer_spec.unk_id = {} names piece '{}', which is not of type UNKNOWN", m.trainer.unk_id,
                       m.pieces[m.trainer.unk_id].piece));
  const std::pair<const char*, int32_t> ids[] = {{"trainer_spec.bos_id", m.trainer.bos_id},
                                                 {"trainer_spec.eos_id", m.trainer.eos_id},
                                                 {"trainer_spec.pad_id", m.trainer.pad_id}};
  for (const auto& [field, id] : ids)
    if (id < -1 || id >= n) r.fail(fmt::format("{} = {} is outside the {} pieces", field, id, n));
  return m;
}

SpmModelProto read_spm_model(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot read the SentencePiece model", path));
  std::ostringstream s;
  s << in.rdbuf();
  return parse_spm_model(s.str(), path);
}

}  // namespace mt
