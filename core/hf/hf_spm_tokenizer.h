// hf_spm_tokenizer.h: a SentencePiece model as a Hugging Face tokenizer.json that the `tokenizers` package
// (and so AutoTokenizer) encodes as SentencePieceProcessor::Encode does, for `ckpt export --format hf`.
//
// SentencePiece's steps and their tokenizers counterparts:
//   normalize   precompiled charsmap -> Precompiled; remove_extra_whitespaces (drop leading and trailing ' ',
//               runs of ' ' to one: only U+0020 after the charsmap, not tabs or other Unicode spaces) ->
//               Replace with the regexes \A +, ' +\z', ' {2,}'; add_dummy_prefix -> Prepend (which, like
//               SentencePiece, adds nothing to an empty text); escape_whitespaces -> Replace(' ', U+2581).
//   segment     no pre-tokenizer: the model sees the whole normalized text, as SentencePiece's does.
//               unigram: a Unigram model with the pieces' scores, unk_id, byte_fallback. Pieces that
//               SentencePiece never matches in text (unknown, control, byte, unused) get a score so low that
//               no best path uses them (see hf_spm_tokenizer.cpp); their ids and texts are kept.
//               BPE: a BPE model whose merges are every split of a normal piece into two normal pieces,
//               ranked by the merged piece's score (highest first), as transformers' converter orders them;
//               unk_token, fuse_unk, byte_fallback.
//   decode      unk -> trainer_spec.unk_surface (" ⁇ "), ByteFallback, Metaspace (U+2581 -> ' ', the dummy
//               prefix of the first piece dropped), Fuse.
// Control and unknown pieces are special added tokens; tokenizer_config.json sets split_special_tokens so
// that "<s>" in a text is encoded as text, as SentencePiece does. User-defined pieces become (non-special)
// added tokens as transformers makes them.
//
// Where the result can differ from SentencePiece (known, by design of the two libraries):
//   - unigram: SentencePiece sums path scores in float32, tokenizers in float64. Segmentations whose total
//     scores tie exactly (the same pieces in another order, as in long runs "aaaa...", "!?!?...", "111") or
//     differ by less than float32 resolution in long texts are broken differently.
//   - a control or unknown piece containing a character that no single-character piece covers can win
//     against <unk> in the text that spells it (e.g. "<s>" in text when "<" is not in the vocabulary).
//   - user-defined pieces: SentencePiece adds the dummy prefix once, before the whole text; tokenizers
//     normalizes the text between added tokens separately (each part gets it). Unused pieces (BPE) are
//     merged to but not resegmented.
// treat_whitespace_as_suffix and the WORD / CHAR model types have no counterpart: CheckpointError.
#pragma once
#include <nlohmann/json.hpp>

#include "core/tokenizer/spm_model_proto.h"

namespace mt {

// The tokenizer.json document for model m; `name` (the .model file) is named in errors.
nlohmann::ordered_json spm_tokenizer_json(const SpmModelProto& m, const std::string& name);

}  // namespace mt
