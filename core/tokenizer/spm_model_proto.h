// spm_model_proto.h: the fields of a SentencePiece .model (a serialized sentencepiece.ModelProto) that an
// export to another tokenizer format needs, read from the protobuf wire format directly: Debian's
// libsentencepiece-dev ships no sentencepiece_model.pb.h. Field numbers and defaults are those of
// sentencepiece_model.proto; fields absent from the file keep the proto's defaults, fields not listed here
// are skipped.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mt {

// ModelProto.SentencePiece.Type
enum class SpmPieceType : int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };
// TrainerSpec.ModelType
enum class SpmModelType : int32_t { unigram = 1, bpe = 2, word = 3, character = 4 };

struct SpmPiece {
  std::string piece;  // UTF-8, U+2581 for a space
  float score = 0.f;  // unigram: log probability; BPE: minus the merge rank
  SpmPieceType type = SpmPieceType::normal;
};

struct SpmTrainerSpec {
  SpmModelType model_type = SpmModelType::unigram;
  int32_t vocab_size = 8000;
  bool byte_fallback = false;               // pieces outside the vocabulary become <0xNN> byte pieces
  bool split_by_whitespace = true;          // pieces never hold U+2581 past their first character
  bool treat_whitespace_as_suffix = false;  // U+2581 ends pieces instead of starting them
  bool allow_whitespace_only_pieces = false;
  int32_t unk_id = 0, bos_id = 1, eos_id = 2, pad_id = -1;  // -1: the model has no such piece
  std::string unk_piece = "<unk>", bos_piece = "<s>", eos_piece = "</s>", pad_piece = "<pad>";
  std::string unk_surface = " \xE2\x81\x87 ";  // what decoding prints for <unk>: " ⁇ "
};

struct SpmNormalizerSpec {
  std::string name;                      // "nmt_nfkc", "identity", ...
  std::string precompiled_charsmap;      // binary (a double-array trie + replacement strings); empty: no mapping
  bool add_dummy_prefix = true;          // a U+2581 before every non-empty text
  bool remove_extra_whitespaces = true;  // strip leading/trailing spaces, collapse runs to one
  bool escape_whitespaces = true;        // spaces become U+2581
};

struct SpmModelProto {
  std::vector<SpmPiece> pieces;  // (vocab,) the id of a piece is its index
  SpmTrainerSpec trainer;
  SpmNormalizerSpec normalizer;
};

// Parses the bytes of a .model; `name` (the file) is named in errors. Throws DataError naming the file and
// the field on a truncated or malformed message, an unknown piece type or model type, or ids out of range.
SpmModelProto parse_spm_model(std::string_view bytes, const std::string& name);
// Reads and parses the file at path.
SpmModelProto read_spm_model(const std::string& path);

}  // namespace mt
